"""The hardware ledger: remediation records, counts per hardware id, and the denylist of bad boards.

One interface, two stores: SQLite under .gpuheal/ (embedded default) and DynamoDB with
conditional writes (production), so two controllers racing never lose an update.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Protocol

from temporalio import activity

import api as c
from activities.outcomes import REPEAT_WINDOWS_D, count_outcome


class Ledger(Protocol):
    def record(self, rec: c.RemediationRecord) -> bool: ...
    def records(self, since: datetime | None = None) -> list[c.RemediationRecord]: ...
    def count_recent(self, hardware_ids: list[str], since: datetime, exclude_episode: str | None,
                     by_board: bool = False) -> int: ...
    def deny(self, hardware_ids: list[str], node: str, reason: str) -> list[str]: ...
    def denied(self, hardware_ids: list[str]) -> dict[str, str]: ...
    def admit(self, node: str, hardware_ids: list[str]) -> None: ...
    def admitted(self, node: str) -> list[str]: ...
    def last_started(self, node: str, exclude_episode: str | None) -> datetime | None: ...


# Outcomes of episodes that changed nothing on the node's hardware.
_CHANGED_NOTHING = {"dry_run", "healthy", "rejected"}


def counts_as_remediation(attribution: str | None, rungs: list[str], outcome: str) -> bool:
    """Only platform episodes that acted on the node count toward a repeat offender: a user's bug
    (application), a dry run or a rejected report says nothing about the board."""
    return attribution == "platform" and bool(rungs) and outcome not in _CHANGED_NOTHING


class SqliteLedger:
    def __init__(self, path: str | Path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self.lock = threading.Lock()
        with self.lock:
            self.db.executescript("""
                PRAGMA journal_mode=WAL;
                CREATE TABLE IF NOT EXISTS remediation (
                    episode TEXT PRIMARY KEY, node TEXT, fault_class TEXT, attribution TEXT, rungs TEXT,
                    outcome TEXT, started_at TEXT, ended_at TEXT);
                CREATE TABLE IF NOT EXISTS remediation_hw (episode TEXT, hardware_id TEXT, ended_at TEXT,
                    PRIMARY KEY (episode, hardware_id));
                CREATE INDEX IF NOT EXISTS remediation_hw_id ON remediation_hw (hardware_id, ended_at);
                CREATE TABLE IF NOT EXISTS remediation_board (episode TEXT, hardware_id TEXT, ended_at TEXT,
                    PRIMARY KEY (episode, hardware_id));
                CREATE INDEX IF NOT EXISTS remediation_board_id ON remediation_board (hardware_id, ended_at);
                CREATE TABLE IF NOT EXISTS denylist (hardware_id TEXT PRIMARY KEY, node TEXT, reason TEXT, at TEXT);
                CREATE TABLE IF NOT EXISTS admitted (node TEXT, hardware_id TEXT, at TEXT, PRIMARY KEY (node, hardware_id));
                CREATE TABLE IF NOT EXISTS remediation_body (episode TEXT PRIMARY KEY, body TEXT);
            """)

    def record(self, rec: c.RemediationRecord) -> bool:
        with self.lock:
            cur = self.db.execute(
                "INSERT OR IGNORE INTO remediation VALUES (?,?,?,?,?,?,?,?)",
                (rec.episode, rec.node, rec.fault_class, rec.attribution, json.dumps(rec.rungs), rec.outcome,
                 rec.started_at.isoformat(), rec.ended_at.isoformat()))
            self.db.executemany("INSERT OR IGNORE INTO remediation_hw VALUES (?,?,?)",
                                [(rec.episode, h, rec.ended_at.isoformat()) for h in rec.hardware_ids])
            self.db.executemany("INSERT OR IGNORE INTO remediation_board VALUES (?,?,?)",
                                [(rec.episode, h, rec.ended_at.isoformat()) for h in rec.boards])
            # The whole record (phases, pods: the outcome ledger); the columns above stay for old readers.
            self.db.execute("INSERT OR IGNORE INTO remediation_body VALUES (?,?)", (rec.episode, rec.model_dump_json()))
            return cur.rowcount == 1

    def records(self, since: datetime | None = None) -> list[c.RemediationRecord]:
        """Every record that ended at or after `since`, oldest first (rows from before the outcome
        ledger have no body: rebuilt from their columns)."""
        with self.lock:
            rows = self.db.execute(
                "SELECT r.episode, r.node, r.fault_class, r.attribution, r.rungs, r.outcome, r.started_at, r.ended_at, "
                "b.body FROM remediation r LEFT JOIN remediation_body b ON b.episode = r.episode "
                "WHERE r.ended_at >= ? ORDER BY r.ended_at", ((since or datetime.min.replace(tzinfo=UTC)).isoformat(),)
            ).fetchall()
            hw = dict(self.db.execute("SELECT episode, json_group_array(hardware_id) FROM remediation_hw "
                                      "GROUP BY episode").fetchall())
        out = []
        for episode, node, fault, attribution, rungs, outcome, started, ended, body in rows:
            out.append(c.RemediationRecord.model_validate_json(body) if body else c.RemediationRecord(
                node=node, episode=episode, hardware_ids=json.loads(hw.get(episode, "[]")), fault_class=fault,
                attribution=attribution, rungs=json.loads(rungs), outcome=outcome,
                started_at=datetime.fromisoformat(started), ended_at=datetime.fromisoformat(ended)))
        return out

    def count_recent(self, hardware_ids: list[str], since: datetime, exclude_episode: str | None,
                     by_board: bool = False) -> int:
        if not hardware_ids:
            return 0
        marks = ",".join("?" * len(hardware_ids))
        table = "remediation_board" if by_board else "remediation_hw"
        with self.lock:
            rows = self.db.execute(
                f"SELECT DISTINCT r.episode, r.attribution, r.rungs, r.outcome FROM {table} h "
                f"JOIN remediation r ON r.episode = h.episode WHERE h.hardware_id IN ({marks}) "
                "AND h.ended_at >= ? AND h.episode != ?", (*hardware_ids, since.isoformat(), exclude_episode or "")).fetchall()
        return sum(1 for _, attribution, rungs, outcome in rows if counts_as_remediation(attribution, json.loads(rungs), outcome))

    def deny(self, hardware_ids: list[str], node: str, reason: str) -> list[str]:
        added = []
        with self.lock:
            for h in hardware_ids:
                cur = self.db.execute("INSERT OR IGNORE INTO denylist VALUES (?,?,?,?)",
                                      (h, node, reason, datetime.now(UTC).isoformat()))
                if cur.rowcount == 1:
                    added.append(h)
        return added

    def denied(self, hardware_ids: list[str]) -> dict[str, str]:
        if not hardware_ids:
            return {}
        marks = ",".join("?" * len(hardware_ids))
        with self.lock:
            rows = self.db.execute(f"SELECT hardware_id, reason FROM denylist WHERE hardware_id IN ({marks})",
                                   hardware_ids).fetchall()
        return dict(rows)

    def admit(self, node: str, hardware_ids: list[str]) -> None:
        with self.lock:
            self.db.executemany("INSERT OR IGNORE INTO admitted VALUES (?,?,?)",
                                [(node, h, datetime.now(UTC).isoformat()) for h in hardware_ids])

    def last_started(self, node: str, exclude_episode: str | None) -> datetime | None:
        with self.lock:
            row = self.db.execute("SELECT MAX(started_at) FROM remediation WHERE node = ? AND episode != ?",
                                  (node, exclude_episode or "")).fetchone()
        return datetime.fromisoformat(row[0]) if row and row[0] else None

    def admitted(self, node: str) -> list[str]:
        with self.lock:
            rows = self.db.execute("SELECT hardware_id FROM admitted WHERE node = ?", (node,)).fetchall()
        return sorted(r[0] for r in rows)


class DynamoLedger:
    """One table, partition key `pk`, sort key `sk`: records under EP#<episode>, hardware rows under HW#<id>."""

    def __init__(self, dynamodb, table: str):
        self.ddb, self.table = dynamodb, table

    @staticmethod
    def create_table(dynamodb, table: str) -> None:
        dynamodb.create_table(
            TableName=table, BillingMode="PAY_PER_REQUEST",
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                                  {"AttributeName": "sk", "AttributeType": "S"}])

    def _put_new(self, item: dict) -> bool:
        """A conditional put: the first writer wins, a racing or retried second one changes nothing."""
        try:
            self.ddb.put_item(TableName=self.table, Item=item, ConditionExpression="attribute_not_exists(pk)")
            return True
        except self.ddb.exceptions.ConditionalCheckFailedException:
            return False

    def record(self, rec: c.RemediationRecord) -> bool:
        first = self._put_new({"pk": {"S": f"EP#{rec.episode}"}, "sk": {"S": "record"},
                               "body": {"S": rec.model_dump_json()}})
        counts = counts_as_remediation(rec.attribution, rec.rungs, rec.outcome)
        for prefix, ids in (("HW", rec.hardware_ids), ("BOARD", rec.boards)):
            for h in ids:
                self._put_new({"pk": {"S": f"{prefix}#{h}"}, "sk": {"S": f"{rec.ended_at.isoformat()}#{rec.episode}"},
                               "episode": {"S": rec.episode}, "counts": {"BOOL": counts}})
        self._put_new({"pk": {"S": f"NODE#{rec.node}"}, "sk": {"S": f"{rec.started_at.isoformat()}#{rec.episode}"},
                       "episode": {"S": rec.episode}})
        return first

    def last_started(self, node: str, exclude_episode: str | None) -> datetime | None:
        pages = self.ddb.get_paginator("query").paginate(
            TableName=self.table, KeyConditionExpression="pk = :pk", ScanIndexForward=False, ConsistentRead=True,
            ExpressionAttributeValues={":pk": {"S": f"NODE#{node}"}})
        for page in pages:
            for item in page["Items"]:
                if item["episode"]["S"] != exclude_episode:
                    return datetime.fromisoformat(item["sk"]["S"].split("#", 1)[0])
        return None

    def records(self, since: datetime | None = None) -> list[c.RemediationRecord]:
        """Every record that ended at or after `since`, oldest first: a scan (an operator's report,
        not a hot path)."""
        out = []
        for page in self.ddb.get_paginator("scan").paginate(
                TableName=self.table, FilterExpression="begins_with(pk, :ep) AND sk = :record",
                ExpressionAttributeValues={":ep": {"S": "EP#"}, ":record": {"S": "record"}}):
            out += [c.RemediationRecord.model_validate_json(i["body"]["S"]) for i in page["Items"]]
        return sorted((r for r in out if since is None or r.ended_at >= since), key=lambda r: r.ended_at)

    def count_recent(self, hardware_ids: list[str], since: datetime, exclude_episode: str | None,
                     by_board: bool = False) -> int:
        episodes, prefix = set(), "BOARD" if by_board else "HW"
        for h in hardware_ids:
            pages = self.ddb.get_paginator("query").paginate(
                TableName=self.table, KeyConditionExpression="pk = :pk AND sk >= :since",
                FilterExpression="#counts = :yes", ExpressionAttributeNames={"#counts": "counts"},
                ExpressionAttributeValues={":pk": {"S": f"{prefix}#{h}"}, ":since": {"S": since.isoformat()},
                                           ":yes": {"BOOL": True}})
            episodes |= {i["episode"]["S"] for page in pages for i in page["Items"]}
        episodes.discard(exclude_episode)
        return len(episodes)

    def deny(self, hardware_ids: list[str], node: str, reason: str) -> list[str]:
        return [h for h in hardware_ids if self._put_new({
            "pk": {"S": f"DENY#{h}"}, "sk": {"S": "deny"}, "node": {"S": node}, "reason": {"S": reason},
            "at": {"S": datetime.now(UTC).isoformat()}})]

    def denied(self, hardware_ids: list[str]) -> dict[str, str]:
        out = {}
        for h in hardware_ids:
            item = self.ddb.get_item(TableName=self.table, Key={"pk": {"S": f"DENY#{h}"}, "sk": {"S": "deny"}},
                                     ConsistentRead=True).get("Item")
            if item:
                out[h] = item["reason"]["S"]
        return out

    def admit(self, node: str, hardware_ids: list[str]) -> None:
        for h in hardware_ids:
            self._put_new({"pk": {"S": f"ADMIT#{node}"}, "sk": {"S": h}, "at": {"S": datetime.now(UTC).isoformat()}})

    def admitted(self, node: str) -> list[str]:
        pages = self.ddb.get_paginator("query").paginate(
            TableName=self.table, KeyConditionExpression="pk = :pk", ConsistentRead=True,
            ExpressionAttributeValues={":pk": {"S": f"ADMIT#{node}"}})
        return sorted(i["sk"]["S"] for page in pages for i in page["Items"])


class LedgerActivities:
    def __init__(self, ledger: Ledger):
        self.ledger = ledger

    @activity.defn(name=c.LEDGER_RECORD)
    async def record(self, rec: c.RemediationRecord) -> None:
        first = await asyncio.to_thread(self.ledger.record, rec)
        if first:  # a retried or racing write counts once
            repeats = {}
            if counts_as_remediation(rec.attribution, rec.rungs, rec.outcome):
                for days in REPEAT_WINDOWS_D:
                    repeats[days] = await asyncio.to_thread(
                        self.ledger.count_recent, rec.hardware_ids, rec.started_at - timedelta(days=days), rec.episode)
            count_outcome(activity.metric_meter(), rec, repeats)

    @activity.defn(name=c.LEDGER_COUNT_RECENT)
    async def count_recent(self, req: c.CountRecentRequest) -> int:
        since = datetime.now(UTC) - timedelta(seconds=req.window_s)
        return await asyncio.to_thread(self.ledger.count_recent, req.hardware_ids, since, req.exclude_episode,
                                       req.by_board)

    @activity.defn(name=c.LEDGER_DENYLIST)
    async def denylist(self, req: c.DenylistRequest) -> c.DenylistResult:
        added = await asyncio.to_thread(self.ledger.deny, req.hardware_ids, req.node, req.reason)
        return c.DenylistResult(added=added)

    @activity.defn(name=c.LEDGER_CHECK_DENIED)
    async def check_denied(self, req: c.CheckDeniedRequest) -> c.CheckDeniedResult:
        return c.CheckDeniedResult(denied=await asyncio.to_thread(self.ledger.denied, req.hardware_ids))

    @activity.defn(name=c.LEDGER_ADMIT)
    async def admit(self, req: c.AdmitRequest) -> None:
        await asyncio.to_thread(self.ledger.admit, req.node, req.hardware_ids)

    @activity.defn(name=c.LEDGER_ADMITTED)
    async def admitted(self, req: c.AdmittedRequest) -> c.AdmittedResult:
        return c.AdmittedResult(hardware_ids=await asyncio.to_thread(self.ledger.admitted, req.node))

    @activity.defn(name=c.LEDGER_LAST_STARTED)
    async def last_started(self, req: c.LastStartedRequest) -> c.LastStartedResult:
        return c.LastStartedResult(started_at=await asyncio.to_thread(self.ledger.last_started, req.node,
                                                                      req.exclude_episode))
