"""``peakmem calibrate``: fit one machine's CUDA context and allocator fragmentation from what a user
measured there, and keep them as a named profile that ``--profile NAME`` loads into
:class:`~peakmem.formulas.overhead.Overheads`.

The two figures are fitted in the form the estimate uses them (:func:`peakmem.estimate._estimate`,
:func:`peakmem.formulas.allocator.reserved_bytes`):

* ``device_total = reserved + context + cuBLAS workspace``, where the estimate's reserved leaves the
  cuBLAS workspace out (it adds it on top) but a measured ``max_memory_reserved`` holds it, so the
  context is ``measured device total - measured reserved``: an estimate whose reserved matches the
  measured reserved less the workspace then reproduces the measured device total;
* ``reserved = ceil_2MiB(persistent + rounding + churn * (1 + fragmentation))`` with
  ``churn = allocated peak - persistent`` (the bytes that come and go every step: activations,
  gradients, temporaries), so ``fragmentation = (reserved - allocated) / churn``. The persistent part
  (parameters, buffers, master weights, optimizer states) comes from the measurement's own breakdown
  (``peakmem measure``), the snapshot's attribution, or ``allocated_bytes.all.current`` of a
  ``torch.cuda.memory_stats()`` dump taken after a step (what is still allocated then).

Several measurements give the median of each figure. The fitting is pure; the profile's storage (one
JSON file per profile in the user's config folder) is the small edge at the bottom of this module.
"""

from __future__ import annotations

import json
import os
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peakmem.errors import InputError, suggest
from peakmem.formulas.allocator import DEFAULT_FRAGMENTATION
from peakmem.formulas.overhead import CUBLAS_WORKSPACE_BYTES, Overheads
from peakmem.units import MiB, parse_size
from peakmem.userfiles import parse_json, read_user_text
from peakmem.validate import MAX_DEVICE_BYTES

PROFILE_FORMAT = 1  # "peakmem_profile" in the file: bump when its fields change meaning
PROFILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
CONFIG_DIR_ENV = "PEAKMEM_CONFIG_DIR"  # overrides the whole peakmem config folder (tests, CI)
MAX_INPUT_BYTES = 50 * 1000 * 1000  # a measure JSON or memory_stats dump is ~10-100 KB
NVIDIA_SMI_USED = "memory.used"  # nvidia-smi --query-gpu=memory.used,... --format=csv: column header
NVIDIA_SMI_UNIT = MiB  # nvidia-smi prints memory in MiB ("40960 MiB")
# torch.cuda.memory_stats() keys (torch/cuda/memory.py memory_stats: "<stat>.<pool>.<metric>")
STAT_ALLOCATED_PEAK = "allocated_bytes.all.peak"
STAT_RESERVED_PEAK = "reserved_bytes.all.peak"
STAT_ALLOCATED_NOW = "allocated_bytes.all.current"
# Categories that stay allocated across steps (peakmem.breakdown.Category values)
PERSISTENT_CATEGORIES = ("parameters", "buffers", "master_weights", "optimizer_states")


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """What one run on the user's GPU showed (bytes)."""

    source: str  # what it was read from, e.g. "measure JSON run.json"
    peak_allocated_bytes: int  # torch.cuda.max_memory_allocated
    peak_reserved_bytes: int  # torch.cuda.max_memory_reserved
    device_total_bytes: int | None = None  # nvidia-smi's used memory (None: not measured)
    persistent_bytes: int | None = None  # long-lived bytes at the peak (None: unknown)
    gpu: str | None = None
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("peak_allocated_bytes", "peak_reserved_bytes", "device_total_bytes", "persistent_bytes"):
            value = getattr(self, name)
            if value is None and name in ("device_total_bytes", "persistent_bytes"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_DEVICE_BYTES:
                raise InputError(f"{self.source}: {name}={value!r}: must be a byte count in 0..2^50")
        if self.peak_reserved_bytes < self.peak_allocated_bytes:
            raise InputError(
                f"{self.source}: peak_reserved_bytes={self.peak_reserved_bytes} is below "
                f"peak_allocated_bytes={self.peak_allocated_bytes}; the caching allocator reserves at "
                "least what it hands out"
            )

    @property
    def context_bytes(self) -> int | None:
        """Device total - reserved (0 when nvidia-smi showed less than the peak reserved)."""
        if self.device_total_bytes is None:
            return None
        return max(0, self.device_total_bytes - self.peak_reserved_bytes)

    @property
    def fragmentation(self) -> float | None:
        """(reserved - allocated) / churn, clipped to Overheads' range 0..1 (None: no churn known)."""
        if self.persistent_bytes is None:
            return None
        churn = self.peak_allocated_bytes - self.persistent_bytes
        if churn <= 0:
            return None
        return min(1.0, max(0.0, (self.peak_reserved_bytes - self.peak_allocated_bytes) / churn))


@dataclass(frozen=True, kw_only=True)
class Profile:
    """A machine's fitted overheads, as stored and as ``--profile`` loads them."""

    name: str
    context_bytes: int
    fragmentation: float
    gpu: str | None = None
    measurements: tuple[Measurement, ...] = ()
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        check_profile_name(self.name)

    def overheads(self) -> Overheads:
        """The :class:`Overheads` this profile stands for (cuBLAS workspace: peakmem's named default)."""
        return Overheads(
            context_bytes=self.context_bytes,
            context_source=f"calibrated profile {self.name!r} (peakmem calibrate: "
            f"{len(self.measurements)} measurement(s){', ' + self.gpu if self.gpu else ''})",
            fragmentation=self.fragmentation,
            profile=self.name,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "peakmem_profile": PROFILE_FORMAT,
            "name": self.name,
            "gpu": self.gpu,
            "context_bytes": self.context_bytes,
            "fragmentation": self.fragmentation,
            "measurements": [
                {
                    "source": m.source,
                    "gpu": m.gpu,
                    "peak_allocated_bytes": m.peak_allocated_bytes,
                    "peak_reserved_bytes": m.peak_reserved_bytes,
                    "device_total_bytes": m.device_total_bytes,
                    "persistent_bytes": m.persistent_bytes,
                    "context_bytes": m.context_bytes,
                    "fragmentation": m.fragmentation,
                    "notes": list(m.notes),
                }
                for m in self.measurements
            ],
            "notes": list(self.notes),
        }

    @classmethod
    def from_json(cls, obj: Any, where: str) -> Profile:
        if not isinstance(obj, dict) or obj.get("peakmem_profile") != PROFILE_FORMAT:
            raise InputError(
                f"{where}: not a peakmem profile (format {PROFILE_FORMAT}); run peakmem calibrate"
            )
        try:
            measurements = tuple(
                Measurement(
                    source=str(m["source"]), gpu=m.get("gpu"),
                    peak_allocated_bytes=m["peak_allocated_bytes"],
                    peak_reserved_bytes=m["peak_reserved_bytes"],
                    device_total_bytes=m.get("device_total_bytes"),
                    persistent_bytes=m.get("persistent_bytes"), notes=tuple(m.get("notes", ())),
                )
                for m in obj.get("measurements", ())
            )  # fmt: skip
            profile = cls(
                name=obj["name"], context_bytes=obj["context_bytes"], fragmentation=obj["fragmentation"],
                gpu=obj.get("gpu"), measurements=measurements, notes=tuple(obj.get("notes", ())),
            )  # fmt: skip
            profile.overheads()  # Overheads validates the two figures' ranges
        except (KeyError, TypeError, ValueError) as err:
            raise InputError(
                f"{where}: a damaged peakmem profile ({err}); run peakmem calibrate again"
            ) from None
        return profile


def check_profile_name(name: object) -> None:
    if not isinstance(name, str) or not PROFILE_NAME.match(name):
        raise InputError(
            f"profile={name!r}: a profile name is 1-64 letters, digits, '.', '_' or '-', starting with a "
            "letter or digit"
        )


def fit_profile(name: str, measurements: Sequence[Measurement]) -> Profile:
    """The median context and fragmentation over ``measurements``; a figure no measurement can give
    keeps peakmem's default and says so in ``notes``."""
    if not measurements:
        raise InputError("calibrate: give at least one measurement (a measure JSON, a memory_stats dump "
                         "or a memory snapshot)")  # fmt: skip
    notes: list[str] = []
    contexts = [c for c in (m.context_bytes for m in measurements) if c is not None]
    fragments = [f for f in (m.fragmentation for m in measurements) if f is not None]
    default = Overheads()
    if contexts:
        context = int(statistics.median(contexts))
        notes.append(f"CUDA context = median over {len(contexts)} of device total - peak reserved")
    else:
        context = default.context_bytes
        notes.append("CUDA context: no measurement had nvidia-smi's used memory (--nvidia-smi-used); "
                     f"peakmem's default kept ({default.context_source})")  # fmt: skip
    if fragments:
        fragmentation = round(statistics.median(fragments), 4)
        notes.append(f"fragmentation = median over {len(fragments)} of (reserved - allocated) / "
                     "(allocated - persistent) at the peak")  # fmt: skip
    else:
        fragmentation = DEFAULT_FRAGMENTATION
        notes.append("fragmentation: no measurement split persistent from per-step bytes; "
                     f"peakmem's default {DEFAULT_FRAGMENTATION} kept")  # fmt: skip
    gpus = sorted({m.gpu for m in measurements if m.gpu})
    for m in measurements:
        notes.extend(f"{m.source}: {n}" for n in m.notes)
    return Profile(
        name=name, context_bytes=context, fragmentation=fragmentation,
        gpu=", ".join(gpus) if gpus else None, measurements=tuple(measurements), notes=tuple(notes),
    )  # fmt: skip


# --- readers of what users measured ----------------------------------------------------------------
def measurement_from_measure_json(obj: Mapping[str, Any], source: str) -> Measurement:
    """The JSON of ``peakmem measure --json`` (answers.estimate_json of a measured Estimate)."""
    try:
        if obj.get("method") != "measured":
            raise InputError(
                f"{source}: not the JSON of `peakmem measure --json` (method={obj.get('method')!r})"
            )
        breakdown = obj.get("breakdown") or {}
        persistent = sum(int(breakdown.get(c, 0)) for c in PERSISTENT_CATEGORIES)
        device = str(obj.get("device", "?"))
        notes: list[str] = []
        if not device.startswith("cuda"):
            notes.append(f"measured on {device}: no CUDA context nor caching allocator there, so "
                         "this says context 0 and fragmentation 0; measure with --device cuda")  # fmt: skip
        grad_accum = (obj.get("setup") or {}).get("grad_accum", 1)
        if isinstance(grad_accum, int) and grad_accum > 1:
            persistent += int(breakdown.get("gradients", 0))  # accumulated gradients live across steps
        reserved = obj["peak_reserved_bytes"]
        return Measurement(
            source=source, gpu=obj.get("gpu_name") if isinstance(obj.get("gpu_name"), str) else None,
            peak_allocated_bytes=obj["peak_allocated_bytes"], peak_reserved_bytes=reserved,
            device_total_bytes=obj["device_total_bytes"] if device.startswith("cuda") else reserved,
            persistent_bytes=persistent, notes=tuple(notes),
        )  # fmt: skip
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        if isinstance(err, InputError):
            raise
        raise InputError(
            f"{source}: not the JSON of `peakmem measure --json` (missing or bad {err})"
        ) from None


def measurement_from_memory_stats(
    stats: Mapping[str, Any], source: str, *, device_total_bytes: int | None = None, gpu: str | None = None
) -> Measurement:
    """A ``torch.cuda.memory_stats()`` dump (JSON), taken after a training step."""
    missing = [k for k in (STAT_ALLOCATED_PEAK, STAT_RESERVED_PEAK) if k not in stats]
    if missing:
        raise InputError(f"{source}: not a torch.cuda.memory_stats() dump (no {', '.join(missing)})")
    now = stats.get(STAT_ALLOCATED_NOW)
    notes = [f"persistent bytes = {STAT_ALLOCATED_NOW} (what was still allocated when the stats were dumped, "
             "after a step: parameters, optimizer states)"] if now is not None else []  # fmt: skip
    try:
        return Measurement(
            source=source, gpu=gpu, peak_allocated_bytes=stats[STAT_ALLOCATED_PEAK],
            peak_reserved_bytes=stats[STAT_RESERVED_PEAK], device_total_bytes=device_total_bytes,
            persistent_bytes=now, notes=tuple(notes),
        )  # fmt: skip
    except TypeError as err:
        raise InputError(f"{source}: a memory_stats value is not a byte count ({err})") from None


def parse_nvidia_smi_used(text: str) -> tuple[int, str | None]:
    """``--nvidia-smi-used``: a size (``40.1GiB``, ``41060MiB``), a bare number of MiB (as nvidia-smi
    prints), or the CSV of ``nvidia-smi --query-gpu=memory.used,name --format=csv`` (its first GPU).
    Returns (bytes, GPU name or None)."""
    text = text.strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) >= 2 and NVIDIA_SMI_USED in lines[0]:
        header = [h.strip() for h in lines[0].split(",")]
        row = [v.strip() for v in lines[1].split(",")]
        col = next(i for i, h in enumerate(header) if h.startswith(NVIDIA_SMI_USED))
        name = next((row[i] for i, h in enumerate(header) if h == "name" and i < len(row)), None)
        if col < len(row):
            return _smi_value(row[col]), name
    if len(lines) == 1:
        return _smi_value(lines[0]), None
    raise InputError(f"--nvidia-smi-used={text[:80]!r}: give a size (40.1GiB), a number of MiB, or "
                     "the CSV of nvidia-smi --query-gpu=memory.used,name --format=csv")  # fmt: skip


def _smi_value(value: str) -> int:
    value = value.strip()
    if re.fullmatch(r"[0-9]+(\.[0-9]+)?", value):
        return int(float(value) * NVIDIA_SMI_UNIT)
    return parse_size(value.replace(" ", ""))


def read_json_file(path: Path, what: str) -> Any:
    """A JSON file the user named, or an InputError naming the problem (exit 2)."""
    text = read_user_text(path, what=what, max_bytes=MAX_INPUT_BYTES)
    try:
        return parse_json(text)
    except json.JSONDecodeError as err:
        raise InputError(f"{path}: not JSON ({err.msg} at line {err.lineno}); expected {what}") from None
    except ValueError as err:  # nested too deeply, an integer of too many digits
        raise InputError(f"{path}: not JSON ({err}); expected {what}") from None


def measurement_from_json_file(
    path: Path, *, device_total_bytes: int | None = None, gpu: str | None = None
) -> Measurement:
    """A measure JSON or a memory_stats dump, told apart by their keys."""
    obj = read_json_file(path, "the JSON of peakmem measure or of torch.cuda.memory_stats()")
    if not isinstance(obj, dict):
        raise InputError(f"{path}: JSON {type(obj).__name__}, not an object; expected the JSON of "
                         "peakmem measure or of torch.cuda.memory_stats()")  # fmt: skip
    if STAT_ALLOCATED_PEAK in obj:
        return measurement_from_memory_stats(obj, f"memory_stats {path.name}",
                                             device_total_bytes=device_total_bytes, gpu=gpu)  # fmt: skip
    if "fixture" in obj and "peak_allocated_bytes" in obj:  # benchmarks/gpu_fixtures.py's record
        breakdown = obj.get("breakdown") or {}
        try:
            return Measurement(
                source=f"GPU fixture {path.name}", gpu=gpu or obj.get("gpu"),
                peak_allocated_bytes=obj["peak_allocated_bytes"],
                peak_reserved_bytes=obj["peak_reserved_bytes"],
                device_total_bytes=device_total_bytes or obj.get("device_total_bytes"),
                persistent_bytes=sum(int(breakdown.get(c, 0)) for c in PERSISTENT_CATEGORIES) or None,
            )  # fmt: skip
        except (KeyError, TypeError, ValueError) as err:
            raise InputError(f"{path}: a damaged GPU fixture ({err})") from None
    if "peak_allocated_bytes" in obj:
        m = measurement_from_measure_json(obj, f"measure JSON {path.name}")
        if device_total_bytes is not None:  # nvidia-smi read by the user wins over the run's own NVML read
            m = Measurement(source=m.source, peak_allocated_bytes=m.peak_allocated_bytes,
                            peak_reserved_bytes=m.peak_reserved_bytes, device_total_bytes=device_total_bytes,
                            persistent_bytes=m.persistent_bytes, gpu=gpu or m.gpu, notes=m.notes)  # fmt: skip
        return m
    raise InputError(f"{path}: neither the JSON of peakmem measure (peak_allocated_bytes) nor a "
                     f"torch.cuda.memory_stats() dump ({STAT_ALLOCATED_PEAK})")  # fmt: skip


# --- storage (the edge: one JSON file per profile) -------------------------------------------------
def profiles_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$PEAKMEM_CONFIG_DIR/profiles``, else ``$XDG_CONFIG_HOME/peakmem/profiles``, else
    ``~/.config/peakmem/profiles`` (the XDG base directory default)."""
    env = os.environ if env is None else env
    if env.get(CONFIG_DIR_ENV):
        return Path(env[CONFIG_DIR_ENV]) / "profiles"
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "peakmem" / "profiles"


def save_profile(profile: Profile, folder: Path | None = None) -> Path:
    folder = folder or profiles_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{profile.name}.json"
        path.write_text(json.dumps(profile.to_json(), indent=2) + "\n", encoding="utf-8")
    except OSError as err:
        raise InputError(f"{folder}: cannot write the profile there ({err.strerror or err}); "
                         f"set {CONFIG_DIR_ENV} to a writable folder") from None  # fmt: skip
    return path


def list_profiles(folder: Path | None = None) -> list[Profile]:
    folder = folder or profiles_dir()
    if not folder.is_dir():
        return []
    out = []
    for path in sorted(folder.glob("*.json")):
        try:
            out.append(Profile.from_json(read_json_file(path, "a peakmem profile"), str(path)))
        except InputError:
            continue  # a foreign file in the folder is not a profile; load_profile names it
    return out


def load_profile(name: str, folder: Path | None = None) -> Profile:
    check_profile_name(name)
    folder = folder or profiles_dir()
    path = folder / f"{name}.json"
    if not path.exists():  # anything else there (a FIFO, a folder) is refused by the reader, by name
        known = [p.name for p in list_profiles(folder)]
        close = suggest(name, known)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise InputError(
            f"profile={name!r}: no such profile in {folder}{hint} (list them with `peakmem calibrate "
            f"--list`; make one with `peakmem calibrate FILE --name {name}`)"
        )
    return Profile.from_json(read_json_file(path, "a peakmem profile"), str(path))


__all__ = [
    "CUBLAS_WORKSPACE_BYTES",
    "Measurement",
    "Profile",
    "fit_profile",
    "list_profiles",
    "load_profile",
    "measurement_from_json_file",
    "measurement_from_measure_json",
    "measurement_from_memory_stats",
    "parse_nvidia_smi_used",
    "profiles_dir",
    "save_profile",
]
