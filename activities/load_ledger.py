"""Load-test figures in the ledger, per node and GPU serial, and each SKU's fleet median from them
(what `gpuheal baseline` shows and what validations judge a GPU against)."""

from __future__ import annotations

import asyncio
import json
import statistics

from temporalio import activity

import api as c
from activities.ledger import DynamoLedger, SqliteLedger
from policies.load import JUDGED, SkuReference

Row = tuple[str, str, str, str, dict, list]  # sku, node, uuid, at, figures, tests failed


def references(rows: list[Row]) -> dict[str, SkuReference]:
    """Each SKU's median of every judged figure over its GPUs' latest measurements that passed (a
    failed GPU's figures are kept in the ledger, never in what its kind is judged against)."""
    latest: dict[tuple[str, str], Row] = {}
    for row in sorted(rows, key=lambda r: r[3]):
        if not row[5]:
            latest[(row[0], row[2])] = row
    out: dict[str, SkuReference] = {}
    for sku in sorted({k[0] for k in latest}):
        mine = [r for k, r in latest.items() if k[0] == sku]
        medians = {}
        for name in JUDGED:
            values = [r[4][name] for r in mine if name in r[4]]
            if values:
                medians[name] = statistics.median(values)
        out[sku] = SkuReference(sku=sku, nodes=len({r[1] for r in mine}), medians=medians)
    return out


def outliers(rows: list[Row], refs: dict[str, SkuReference], fraction: float) -> list[str]:
    """GPUs whose latest figure is under `fraction` of their SKU's median, in words."""
    latest: dict[tuple[str, str], Row] = {}
    for row in sorted(rows, key=lambda r: r[3]):
        latest[(row[0], row[2])] = row
    out = []
    for (sku, uuid), (_, node, _, _, figures, _) in sorted(latest.items()):
        for name, median in refs.get(sku, SkuReference(sku=sku)).medians.items():
            if name in figures and figures[name] < fraction * median:
                out.append(f"{node} {uuid}: {name} {figures[name]:.3g} = {figures[name] / median:.0%} of the {sku} median")
    return out


class SqliteFigures:
    def __init__(self, ledger: SqliteLedger):
        self.db, self.lock = ledger.db, ledger.lock
        with self.lock:
            self.db.execute("CREATE TABLE IF NOT EXISTS load_figures (episode TEXT, tier TEXT, node TEXT, "
                            "gpu_index INTEGER, uuid TEXT, serial TEXT, sku TEXT, at TEXT, figures TEXT, "
                            "failed TEXT, PRIMARY KEY (episode, uuid, at))")

    def record(self, rec: c.LoadFiguresRecord) -> None:
        with self.lock:
            self.db.executemany("INSERT OR IGNORE INTO load_figures VALUES (?,?,?,?,?,?,?,?,?,?)", [
                (rec.episode, rec.tier, rec.node, g.index, g.uuid, g.serial, g.sku, rec.at.isoformat(),
                 json.dumps(g.figures), json.dumps(g.failed)) for g in rec.gpus])

    def rows(self) -> list[Row]:
        with self.lock:
            found = self.db.execute("SELECT sku, node, uuid, at, figures, failed FROM load_figures").fetchall()
        return [(sku, node, uuid, at, json.loads(f), json.loads(bad)) for sku, node, uuid, at, f, bad in found]


class DynamoFigures:
    """Items FIG#<sku> / <at>#<node>#<uuid>; the SKUs seen listed under FIGSKUS."""

    def __init__(self, ledger: DynamoLedger):
        self.ddb, self.table = ledger.ddb, ledger.table

    def record(self, rec: c.LoadFiguresRecord) -> None:
        for g in rec.gpus:
            self.ddb.put_item(TableName=self.table, Item={"pk": {"S": "FIGSKUS"}, "sk": {"S": g.sku or "?"}})
            self.ddb.put_item(TableName=self.table, Item={
                "pk": {"S": f"FIG#{g.sku or '?'}"}, "sk": {"S": f"{rec.at.isoformat()}#{rec.node}#{g.uuid}"},
                "node": {"S": rec.node}, "uuid": {"S": g.uuid}, "serial": {"S": g.serial or ""},
                "episode": {"S": rec.episode}, "tier": {"S": rec.tier}, "figures": {"S": json.dumps(g.figures)},
                "failed": {"S": json.dumps(g.failed)}})

    def _query(self, pk: str) -> list[dict]:
        pages = self.ddb.get_paginator("query").paginate(
            TableName=self.table, KeyConditionExpression="pk = :pk", ExpressionAttributeValues={":pk": {"S": pk}})
        return [i for page in pages for i in page["Items"]]

    def rows(self) -> list[Row]:
        out = []
        for sku in (i["sk"]["S"] for i in self._query("FIGSKUS")):
            for i in self._query(f"FIG#{sku}"):
                out.append((sku, i["node"]["S"], i["uuid"]["S"], i["sk"]["S"].split("#", 1)[0],
                            json.loads(i["figures"]["S"]), json.loads(i.get("failed", {"S": "[]"})["S"])))
        return out


def figures_store(ledger):
    return SqliteFigures(ledger) if isinstance(ledger, SqliteLedger) else DynamoFigures(ledger)


class LoadFigureActivities:
    def __init__(self, ledger):
        self.store = figures_store(ledger)

    def activities(self) -> list:
        return [self.load_figures, self.baseline]

    @activity.defn(name=c.LEDGER_LOAD_FIGURES)
    async def load_figures(self, rec: c.LoadFiguresRecord) -> None:
        await asyncio.to_thread(self.store.record, rec)

    @activity.defn(name=c.LEDGER_BASELINE)
    async def baseline(self, req: c.BaselineRequest) -> c.BaselineResult:
        refs = references(await asyncio.to_thread(self.store.rows))
        return c.BaselineResult(references={k: v for k, v in refs.items() if not req.skus or k in req.skus})
