"""Kernel-log parsing: NVRM Xid lines, "fallen off the bus", Xid 154 recovery actions -> findings."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path

from pydantic import ValidationError

from policies.findings import RECOVERY_ACTION_BY_CODE, Finding, FindingKind

# /dev/kmsg records start "prio,seq,usec,flags;"; dmesg adds "[timestamp]"; journald "kernel:".
_RECORD_PREFIX = re.compile(r"^\d+,\d+,\d+,[^;]*;")
_RECORD_SEQ = re.compile(r"^\d+,(?P<seq>\d+),\d+,[^;]*;")
_BUS = r"(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.[0-7])?"
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?" + _BUS + r"\): (?P<xid>\d+)(?:, (?P<rest>.*))?$")
_OFF_BUS = re.compile(r"NVRM: GPU (?:at )?(?:PCI:)?" + _BUS + r": GPU has fallen off the bus")
_GPU_AT = re.compile(r"NVRM: GPU at (?:PCI:)?" + _BUS + r": (?P<uuid>GPU-[0-9A-Fa-f-]+)")
_RECOVERY = re.compile(r"recovery action changed from 0x[0-9A-Fa-f]+ \([^)]*\) to 0x(?P<code>[0-9A-Fa-f]+)")
# NVLink5 subcode severity as drivers spell it: Fatal, Nonfatal, NonFatal, non-fatal, Non-Fatal.
_FATALITY = re.compile(r"\b(?P<non>non[- ]?)?fatal\b", re.IGNORECASE)


def bus_key(pci: str) -> tuple[int, int, int]:
    """Domain, bus, device as numbers: "0000:91:00" and NVML's "00000000:91:00.0" match."""
    domain, bus, device = pci.split(".")[0].split(":")[-3:]
    return int(domain, 16), int(bus, 16), int(device, 16)


class KmsgParser:
    """Stateful over a log: remembers "GPU at PCI:...: GPU-<uuid>" lines to name later faults."""

    def __init__(self, uuid_by_bus: dict[str, str] | None = None, index_by_bus: dict[str, int] | None = None):
        self._uuids = {bus_key(k): v for k, v in (uuid_by_bus or {}).items()}
        self._index = {bus_key(k): v for k, v in (index_by_bus or {}).items()}
        self.rejected: list[tuple[str, str]] = []  # (line, why) for lines that could not make a finding

    def parse_line(self, line: str) -> Finding | None:
        """The finding on one line, or None. A line that looks like a fault but cannot make one
        (an Xid code out of range) is kept in `rejected` and skipped, never failing the batch."""
        try:
            return self._parse_line(line)
        except ValidationError as err:
            self.rejected.append((line[:300], err.errors()[0]["msg"]))
            return None

    def _parse_line(self, line: str) -> Finding | None:
        text = _RECORD_PREFIX.sub("", line.rstrip("\n"))
        if (m := _GPU_AT.search(text)) is not None:
            self._uuids[bus_key(m["pci"])] = m["uuid"]
            return None
        if (m := _XID.search(text)) is not None:
            return self._xid_finding(m, text)
        if (m := _OFF_BUS.search(text)) is not None:
            return self._finding(FindingKind.GPU_LOST, m["pci"], None, text)
        return None

    def parse(self, lines: Iterable[str]) -> list[Finding]:
        return [f for line in lines if (f := self.parse_line(line)) is not None]

    def _xid_finding(self, m: re.Match, text: str) -> Finding:
        code, rest = int(m["xid"]), m["rest"] or ""
        if code == 154 and (r := _RECOVERY.search(rest)) is not None:
            action = RECOVERY_ACTION_BY_CODE.get(int(r["code"], 16))
            return self._finding(FindingKind.RECOVERY_ACTION, m["pci"], code, text, recovery_action=action)
        fatal = None
        if 144 <= code <= 150:
            # NVLink5: the subcode's severity decides the action; one we cannot read fails closed.
            f = _FATALITY.search(rest)
            fatal = True if f is None else not f["non"]
        return self._finding(FindingKind.XID, m["pci"], code, text, fatal=fatal)

    def _finding(self, kind: FindingKind, pci: str, xid: int | None, text: str, **extra) -> Finding:
        key = bus_key(pci)
        message = text[text.index("NVRM:"):] if "NVRM:" in text else text
        return Finding(kind=kind, xid=xid, pci=pci, uuid=self._uuids.get(key), gpu_index=self._index.get(key),
                       message=message[:2000], **extra)


class KmsgFollower:
    """New kernel-log lines since the last poll, never blocking: /dev/kmsg records, a pipe, or a growing file.

    /dev/kmsg hands out one record per read and EAGAIN at the end (opened non-blocking); a pipe is
    read non-blocking too (EAGAIN, or end of file with no writer); a file
    (a journal export, a test log) is followed by offset and re-read from the start if it shrinks.
    With a `state` file (on the host, surviving the agent's container) the last record sequence
    number read in this boot is kept, so a restarted agent (a DaemonSet rollout) reads on from
    where its predecessor stopped instead of re-reporting every fault since boot.
    """

    def __init__(self, path: str | Path = "/dev/kmsg", state: str | Path | None = None, boot_id: str = ""):
        self.path = Path(path)
        self.state = Path(state) if state is not None else None
        self.boot_id = boot_id
        self._fd: int | None = None
        self._offset = 0
        self._partial = b""
        self.last_seq = self._load_seq()

    def poll(self) -> list[str]:
        """Raises OSError when the log cannot be read: the caller turns that into probe_broken."""
        if self.path.is_char_device():
            lines = self._poll_kmsg()
        elif self.path.is_fifo():
            lines = self._poll_fifo()
        else:
            lines = self._poll_file()
        fresh = [line for line in lines if self._is_new(line)]
        if fresh and self.state is not None:
            self._save_seq()
        return fresh

    def _is_new(self, line: str) -> bool:
        m = _RECORD_SEQ.match(line)
        if m is None:
            return True  # not a kmsg record (a dmesg or journal line): no sequence to go by
        seq = int(m["seq"])
        if self.last_seq is not None and seq <= self.last_seq:
            return False
        self.last_seq = seq
        return True

    def _load_seq(self) -> int | None:
        try:
            boot, seq = self.state.read_text().split() if self.state else ("", "")
        except (OSError, ValueError):
            return None
        return int(seq) if boot == self.boot_id and seq.isdigit() else None

    def _save_seq(self) -> None:
        try:
            self.state.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.state.with_suffix(".tmp")
            tmp.write_text(f"{self.boot_id} {self.last_seq}\n")
            tmp.replace(self.state)
        except OSError as err:  # the position is an optimisation: losing it re-reads, never misses
            logging.getLogger("gpuheal.kmsg").warning("cannot keep the kernel-log position in %s: %s",
                                                      self.state, err.strerror)

    def _poll_file(self) -> list[str]:
        size = self.path.stat().st_size
        if size < self._offset:
            self._offset, self._partial = 0, b""
        with self.path.open("rb") as fh:
            fh.seek(self._offset)
            data = self._partial + fh.read()
        self._offset = size
        *lines, self._partial = data.split(b"\n")
        return [line.decode(errors="replace") for line in lines]

    def _poll_kmsg(self) -> list[str]:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        out = []
        while True:
            try:
                record = os.read(self._fd, 8192)
            except BlockingIOError:
                return out
            except BrokenPipeError:
                continue  # EPIPE: records were overwritten before we read them; carry on from the next
            if not record:  # end of file: a character device that is not /dev/kmsg (/dev/null)
                return out
            out.append(record.decode(errors="replace"))

    def _poll_fifo(self) -> list[str]:
        """A pipe (a journal piped in, a test): whatever is there now, split into lines, never blocking."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        data = self._partial
        while True:
            try:
                chunk = os.read(self._fd, 65536)
            except BlockingIOError:
                break
            if not chunk:  # no writer (or it closed): nothing more for now
                break
            data += chunk
        *lines, self._partial = data.split(b"\n")
        return [line.decode(errors="replace") for line in lines]

    def rest(self) -> list[str]:
        """A last line with no newline yet (a file read once, not followed)."""
        rest, self._partial = self._partial, b""
        return [rest.decode(errors="replace")] if rest.strip() else []

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
