"""Memory: an address-derived pattern written over a share of free memory and read back, both
polarities, for the tier's passes. Mismatches are counted per GPU with the first index; write
and read-and-verify speeds are figures (a healthy H200: 4.2 and 3.6 TB/s over 69.6 GiB)."""

from __future__ import annotations

from collections.abc import Callable

from health.load.checks import PatternMismatch
from health.load.device import GpuDevice

CHUNK_WORDS = 1 << 26  # 256 MiB per chunk: the pattern's temporaries stay small beside the buffer


def run_memory(dev: GpuDevice, fraction: float, passes: int,
               past_deadline: Callable[[], bool]) -> tuple[dict[str, float], str | None]:
    words = int(dev.free_bytes() * fraction) // 4
    buf = dev.words(words)
    chunk = getattr(dev, "chunk_words", CHUNK_WORDS)
    found = PatternMismatch()
    write_s = read_s = 0.0
    try:
        for p in range(passes):
            for invert in (False, True):
                if past_deadline():
                    raise TimeoutError("memory: the tier's time limit passed")
                seed = 0x5EED0000 + p
                t0 = dev.now()
                for s in range(0, buf.size, chunk):
                    dev.write_pattern(buf[s:s + chunk], s, seed, invert)
                t1 = dev.now()
                for s in range(0, buf.size, chunk):
                    found.add(*dev.check_pattern(buf[s:s + chunk], s, seed, invert))
                t2 = dev.now()
                write_s, read_s = write_s + t1 - t0, read_s + t2 - t1
        tested = dev.tested_bytes(buf)
    finally:
        del buf
    moved = 2 * passes * tested
    figures = {"hbm_gib": tested / 2 ** 30, "hbm_passes": float(passes), "hbm_mismatches": float(found.count),
               **({"hbm_write_tbps": moved / write_s / 1e12, "hbm_read_tbps": moved / read_s / 1e12}
                  if write_s > 0 and read_s > 0 else {})}
    why = (f"{found.count} words read back wrong over {tested / 2 ** 30:.1f} GiB (first at word {found.first})"
           if found.count else None)
    return figures, why
