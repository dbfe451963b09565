import json
import os
import signal
import subprocess
import sys
import time

import pytest

from health.kmsg import KmsgParser, bus_key

REFERENCE = [
    ("NVRM: Xid (0000:03:00): 14, Channel 00000001", "xid", 14, "0000:03:00"),
    ("NVRM: Xid (PCI:0000:5a:00): 79, GPU has fallen off the bus.", "xid", 79, "0000:5a:00"),
    ("[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM "
     "Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter", "xid", 13, "0000:cb:00"),
    ("NVRM: Xid (PCI:0000:00:07): 31, pid=2512125, name=python3.10, Ch 00000008, intr 00000000. MMU Fault: ENGINE "
     "GRAPHICS GPCCLIENT_T1_8 faulted @ 0x73ac_1c000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_WRITE",
     "xid", 31, "0000:00:07"),
    ("kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149",
     "xid", 45, "0000:dc:00"),
    ("NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has "
     "been detected on GPU in the framebuffer at physAddr 0x7fffa8860 partition 7, subpartition 1.", "xid", 48, "0000:07:00"),
    ("NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
     "xid", 63, "0000:10:1c"),
    ("NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for RPC response "
     "from GPU4 GSP! Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4).", "xid", 119, "0000:9b:00"),
    ("NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)",
     "recovery_action", 154, "0009:01:00"),
]


@pytest.mark.parametrize("line,kind,xid,pci", REFERENCE)
def test_reference_lines(line, kind, xid, pci):
    f = KmsgParser().parse_line(line)
    assert (f.kind, f.xid, f.pci) == (kind, xid, pci)
    assert f.message.startswith("NVRM:")


def test_recovery_action_decoded():
    f = KmsgParser().parse_line(REFERENCE[-1][0])
    assert f.recovery_action == "DRAIN_AND_RESET"


@pytest.mark.parametrize("prefix", ["", "6,1234,98765,-;", "[  123.456789] ", "Dec  2 10:00:01 host kernel: ",
                                    "kernel: "])
@pytest.mark.parametrize("pid", ["pid=42", "pid='<unknown>'", "pid=<unknown>"])
def test_prefixes_and_pid_forms(prefix, pid):
    f = KmsgParser().parse_line(f"{prefix}NVRM: Xid (PCI:0000:91:00): 95, {pid}, name=python, Uncontained ECC error")
    assert (f.kind, f.xid, f.pci) == ("xid", 95, "0000:91:00")


def test_fallen_off_bus_without_xid():
    f = KmsgParser().parse_line("NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.")
    assert (f.kind, f.xid, f.pci) == ("gpu_lost", None, "0000:18:00")


@pytest.mark.parametrize("sev,fatal", [("Fatal", True), ("Nonfatal", False), ("NonFatal", False),
                                       ("non-fatal", False), ("Non-Fatal", False), ("FATAL", True),
                                       ("Uncategorized", True)])
def test_nvlink5_subcode_severity(sev, fatal):
    line = f"NVRM: Xid (PCI:0000:1b:00): 145, pid=77, name=python, RLW_REMAP {sev} XC0 i0 Link 12 (0x00004000 0x0)"
    f = KmsgParser().parse_line(line)
    assert (f.xid, f.fatal) == (145, fatal)


def test_bus_id_mapped_to_gpu_from_earlier_line_and_nvml():
    p = KmsgParser(index_by_bus={"00000000:91:00.0": 2})
    assert p.parse_line("NVRM: GPU at PCI:0000:91:00: GPU-8f2a1c3e-0000-1111-2222-333344445555") is None
    f = p.parse_line("NVRM: Xid (PCI:0000:91:00): 79, GPU has fallen off the bus.")
    assert f.uuid == "GPU-8f2a1c3e-0000-1111-2222-333344445555" and f.gpu_index == 2


@pytest.mark.parametrize("noise", ["", "NVRM: loading NVIDIA UNIX x86_64 Kernel Module", "Xid (0000:91:00): 79",
                                   "NVRM: Xid (zzzz:91:00): 79, nope", "usb 1-1: new high-speed USB device"])
def test_noise_ignored(noise):
    assert KmsgParser().parse_line(noise) is None


def test_bus_key_normalises():
    assert bus_key("0000:91:00") == bus_key("00000000:91:00.0") == (0, 0x91, 0)


def test_cli_probe_kmsg_json(tmp_path):
    log = tmp_path / "kmsg.txt"
    log.write_text("\n".join(line for line, *_ in REFERENCE) + "\nunrelated line\n")
    run = subprocess.run([sys.executable, "-m", "workers.cli", "probe", "kmsg", str(log), "--json",
                          "--generation", "hopper"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert [f["xid"] for f in doc["findings"]] == [xid for _, _, xid, _ in REFERENCE]
    assert set(doc["findings"][0]) >= {"kind", "xid", "pci", "uuid", "recovery_action", "message"}
    assert doc["findings"][-1]["recovery_action"] == "DRAIN_AND_RESET"
    assert doc["triage"]["start_rung"] == "reboot"


def test_cli_probe_kmsg_unreadable(tmp_path):
    run = subprocess.run([sys.executable, "-m", "workers.cli", "probe", "kmsg", str(tmp_path / "missing")],
                         capture_output=True, text=True)
    assert run.returncode == 2 and "cannot read" in run.stderr


def test_follower_reads_only_new_lines(tmp_path):
    from health.kmsg import KmsgFollower

    log = tmp_path / "k.log"
    log.write_text("one\ntw")
    f = KmsgFollower(log)
    assert f.poll() == ["one"]
    with log.open("a") as fh:
        fh.write("o\nthree\n")
    assert f.poll() == ["two", "three"]
    assert f.poll() == []
    log.write_text("new\n")  # rotated: shorter than before
    assert f.poll() == ["new"]


def test_one_bad_line_is_one_rejected_line():
    """An Xid code out of range cannot make a finding: that line is rejected, the batch goes on."""
    parser = KmsgParser()
    found = parser.parse(["NVRM: Xid (PCI:0000:1b:00): 79, pid=1, GPU has fallen off the bus.",
                          "NVRM: Xid (PCI:0000:1b:00): 999999999, pid=2, garbage",
                          "NVRM: Xid (PCI:0000:1c:00): 48, pid=3, DBE"])
    assert [f.xid for f in found] == [79, 48]
    assert len(parser.rejected) == 1 and "999999999" in parser.rejected[0][0]


def test_restarted_follower_reads_on_from_its_predecessor(tmp_path):
    """A DaemonSet rollout: the new agent reads kernel-log records after the last one its
    predecessor read in this boot, never again the faults a reset already cured; a new boot's
    log is read from its start."""
    from health.kmsg import KmsgFollower

    log, state = tmp_path / "kmsg", tmp_path / "state/kmsg-position"
    log.write_text("".join(f"3,{seq},100{seq},-;NVRM: Xid (PCI:0000:1b:00): 48, DBE {seq}\n" for seq in (10, 11)))
    first = KmsgFollower(log, state, boot_id="boot-a")
    assert len(first.poll()) == 2 and state.read_text().split() == ["boot-a", "11"]
    with log.open("a") as fh:
        fh.write("3,12,10012,-;NVRM: Xid (PCI:0000:1b:00): 79, after the restart\n")
    restarted = KmsgFollower(log, state, boot_id="boot-a")
    assert restarted.poll() == ["3,12,10012,-;NVRM: Xid (PCI:0000:1b:00): 79, after the restart"]
    after_reboot = KmsgFollower(log, state, boot_id="boot-b")
    assert len(after_reboot.poll()) == 3, "another boot: the position does not apply"


XID_79 = "NVRM: Xid (PCI:0000:5a:00): 79, GPU has fallen off the bus."


def _probe_kmsg(path, *extra, timeout=20):
    return subprocess.run([sys.executable, "-m", "workers.cli", "probe", "kmsg", str(path), "--json", *extra],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("device", ["/dev/null", "/dev/kmsg"])
def test_cli_probe_kmsg_on_a_character_device_reads_what_is_there_and_exits(device):
    # /dev/kmsg blocks at its end unless opened non-blocking (EAGAIN there); /dev/null is a character
    # device anyone can read (end of file at once), so the exit is tested even where /dev/kmsg is not readable.
    if device == "/dev/kmsg" and not os.access(device, os.R_OK):
        device = "/dev/null"
    run = _probe_kmsg(device)  # the timeout fails the test if it blocks
    assert run.returncode == 0, run.stderr
    assert "findings" in json.loads(run.stdout)


def test_cli_probe_kmsg_on_a_fifo_ends_with_what_was_written(tmp_path):
    fifo = tmp_path / "kmsg.fifo"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR)  # holds the pipe open: a blocking reader would wait forever
    try:
        os.write(writer, (XID_79 + "\n").encode())
        run = _probe_kmsg(fifo)
    finally:
        os.close(writer)
    assert run.returncode == 0, run.stderr
    assert [f["xid"] for f in json.loads(run.stdout)["findings"]] == [79]


def test_cli_probe_kmsg_last_line_without_newline_counts(tmp_path):
    log = tmp_path / "k.txt"
    log.write_text(XID_79)
    assert [f["xid"] for f in json.loads(_probe_kmsg(log).stdout)["findings"]] == [79]


def test_cli_probe_kmsg_follow_reads_on_until_stopped(tmp_path):
    log = tmp_path / "k.txt"
    log.write_text("")
    proc = subprocess.Popen([sys.executable, "-m", "workers.cli", "probe", "kmsg", str(log), "--follow"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.5)
        assert proc.poll() is None, "--follow keeps reading"
        with log.open("a") as fh:
            fh.write(XID_79 + "\n")
        line = proc.stdout.readline()
        assert "xid=79" in line
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert "triage (hopper): gpu_lost" in out or "start at reboot" in out
