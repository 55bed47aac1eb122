"""Sweeps: one spec, many runs. The `sweep:` section (and `--sweep PATH=V1,V2`) -> named points, each a full spec.

A point is the spec's data without `sweep`, with its values set at their dotted paths (the one setter
`--set` uses, `trainers.declarations.config.set_dotted`), validated as any spec is. Nothing here is validated
before the values are in: a sweep may supply a field the spec leaves out. Each point's job directory is the
sweep's (`%j` read as the array's job id, `%A`) with the point's name below it (`planning.outdir.for_point`).

Names are stable: a point's name depends only on its own values and on which paths vary across the sweep.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from launchgen.input import hints
from launchgen.input.loader import (
    LinePath,
    LoadedSpec,
    SpecData,
    issues_from_validation,
    parse_yaml,
    validate_spec_data,
)
from launchgen.input.spec import JobSection, Spec
from launchgen.planning import outdir
from launchgen.shared.issues import Issue, SpecError
from launchgen.trainers.declarations.config import set_dotted

KEY = "sweep"
#: SLURM's default MaxArraySize is 1001 (task ids 0-1000)
MAX_POINTS = 1000
NAME_MAX = 64
#: short labels for the leaves people sweep most; any other path is named by its last part
LABELS = {
    "learning_rate": "lr", "num_generations": "ngen", "per_device_train_batch_size": "bs",
    "gradient_accumulation_steps": "ga", "max_completion_length": "len", "temperature": "temp",
    "loss_type": "loss", "tensor_parallel_size": "tp", "max_steps": "steps", "name_or_path": "model",
}
_PATH_PART = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+")
#: `1e-6`: a number in YAML 1.2 and to anyone typing a learning rate, text to PyYAML's YAML 1.1 (no dot)
_EXPONENT_FLOAT = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)[eE][-+]?[0-9]+")
_NOT_SWEPT = ("version", KEY)


class SweepSection(BaseModel):
    """The spec's `sweep:` section (`launchgen schema` shows it beside the spec's own sections)."""

    model_config = ConfigDict(extra="forbid")

    grid: dict[str, list[Any]] = Field(
        default_factory=dict,
        description="Dotted spec path -> the values it takes; every combination is a point (the first path "
        "varies slowest). `--sweep PATH=V1,V2` adds or replaces one.",
    )
    points: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Settings (dotted path -> value), each combined with every grid combination (without a "
        "grid: the points themselves).",
    )
    max_parallel: int | None = Field(
        default=None, ge=1, description="At most this many points run at once (sbatch `--array=...%K`; "
        "`--bash`: side by side where the GPUs allow, default 1).",
    )

    @field_validator("grid")
    @classmethod
    def _values(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        empty = [p for p, vs in v.items() if not vs]
        if empty:
            raise ValueError(f"`{empty[0]}` has no values: give at least one")
        return v

    @field_validator("points")
    @classmethod
    def _settings(cls, v: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if any(not pt for pt in v):
            raise ValueError("a point sets nothing: give each at least one `path: value`")
        return v


@dataclass(frozen=True)
class Point:
    index: int
    name: str
    #: (dotted path, value) in the order the sweep names them
    values: tuple[tuple[str, Any], ...]

    def describe(self) -> str:
        return " ".join(f"{p}={json.dumps(v)}" for p, v in self.values)


@dataclass
class PointSpec:
    point: Point
    loaded: LoadedSpec | None
    #: why the point does not load (its LG0xx issues; `merge_issues` labels them with the point)
    issues: list[Issue] = field(default_factory=list)


@dataclass
class Sweep:
    file: str
    points: list[PointSpec]
    max_parallel: int | None
    #: the sweep options as given on the command line (for the scripts' regenerate line)
    cli: tuple[str, ...] = ()
    #: the line of the spec's `sweep:` key (None: the sweep is the command line's alone)
    line: int | None = None


def _error(code: str, path: str, message: str, fix: str, line: int | None, file: str | None) -> Issue:
    return Issue(code, path, message, fix, "error", line, file)


# ------------------------------------------------------------------------------------------- the paths ---


def path_problem(path: str) -> tuple[str, str] | None:
    """(what is wrong, fix) for a sweep path no spec field has; None for one a point can set. Below a free-form
    mapping (`train.args`) any key goes: the point's own checks judge it, with their "did you mean"."""
    parts = path.split(".")
    if not all(_PATH_PART.fullmatch(p) for p in parts):
        return (f"`{path}` is not a dotted path of field names (e.g. train.args.learning_rate)",
                "Write the path as the spec nests it, sections and keys joined by dots.")
    if parts[0] in _NOT_SWEPT:
        return f"`{parts[0]}` cannot be swept", "Sweep a field of job, slurm, model, vllm, train or estimate."
    current: Any = Spec
    for i, part in enumerate(parts):
        if current is Any:
            return None
        found = hints.child(current, int(part) if part.isdigit() else part)
        if found is None:
            where = ".".join(parts[:i])
            model = hints.model_at(Spec, tuple(int(p) if p.isdigit() else p for p in parts[:i]))
            if model is None:
                return f"`{where}` is a value, not a section: `{path}` names nothing", f"Sweep `{where}` itself."
            guess = hints.closest(part, [f for f in model.model_fields if not (i == 0 and f in _NOT_SWEPT)])
            return (f"`{path}`: {where or 'the spec'} has no field `{part}`",
                    f"Did you mean `{'.'.join([*parts[:i], guess])}`?" if guess else
                    "`launchgen schema` lists every field.")
        current = found
    return None


# ------------------------------------------------------------------------------------------- the names ---


def _value_text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "none"
    if isinstance(v, float):
        return _float_text(v)
    if isinstance(v, (list, tuple)):
        return "-".join(_value_text(x) for x in v) or "empty"
    if isinstance(v, dict):
        return _digest(v)
    text = str(v)
    if "/" in text.strip("/"):  # a path: its last part says which
        text = text.rstrip("/").rsplit("/", 1)[-1]
    return re.sub(r"[^A-Za-z0-9.-]+", "-", text).strip(".-") or "x"


def _float_text(v: float) -> str:
    """The shorter of Python's repr and a compact exponent form: 1e-4 (not 0.0001), 3e-6, 0.04, 1e5."""
    plain = repr(v)
    if plain in ("inf", "-inf", "nan"):
        return plain
    mantissa, _, exp = f"{v:e}".partition("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    compact = f"{mantissa}e{int(exp)}"
    return compact if len(compact) < len(plain) else plain


def _digest(v: Any) -> str:
    return hashlib.sha256(json.dumps(v, sort_keys=True, default=str).encode()).hexdigest()[:6]


def _labels(paths: Sequence[str]) -> dict[str, str]:
    """A short label per path; paths whose labels collide take more of their path, parent first."""
    labels = {p: LABELS.get(p.split(".")[-1], p.split(".")[-1]) for p in paths}
    for depth in range(2, 8):
        seen: dict[str, list[str]] = {}
        for p, lab in labels.items():
            seen.setdefault(lab, []).append(p)
        clashes = [ps for ps in seen.values() if len(ps) > 1]
        if not clashes:
            break
        for ps in clashes:
            for p in ps:
                parts = p.split(".")
                labels[p] = "-".join([*parts[-depth:-1], labels[p].split("-")[-1]])
    return labels


def name_points(values: Sequence[tuple[tuple[str, Any], ...]]) -> list[str]:
    """A short, stable, file-name-safe name per point: `<label><value>` for each path that varies, `_`-joined."""
    paths: list[str] = []
    for vs in values:
        paths += [p for p, _ in vs if p not in paths]
    seen_values = {p: {json.dumps(dict(vs).get(p, "<unset>"), sort_keys=True, default=str) for vs in values}
                   for p in paths}
    varying = [p for p in paths if len(seen_values[p]) > 1] or paths
    labels = _labels(varying)
    names = []
    for vs in values:
        d = dict(vs)
        name = "_".join(f"{labels[p]}{_value_text(d[p])}" for p in varying if p in d) or "base"
        if len(name) > NAME_MAX:
            name = f"{name[:NAME_MAX - 7].rstrip('._-')}-{_digest(d)}"
        names.append(name)
    counts = {n: names.count(n) for n in names}
    return [f"{n}-{_digest(dict(vs))}" if counts[n] > 1 else n for n, vs in zip(names, values, strict=True)]


# --------------------------------------------------------------------------------------- the expansion ---


def parse_cli(item: str) -> tuple[str, list[Any]]:
    """`--sweep PATH=V1,V2` -> (path, values): the values are read as the YAML flow sequence `[V1,V2]`, through
    the same guard as a spec (so `[0,1],[2,3]` is two lists and `'a,b'` one string)."""
    path, sep, raw = item.partition("=")
    path = path.strip()
    fix = "Write --sweep PATH=V1,V2 (e.g. --sweep train.args.learning_rate=1e-6,3e-6)."
    if not sep or not path or not raw.strip():
        raise SpecError([_error("LG020", "--sweep", f"`{item}`: expected PATH=V1,V2", fix, None, None)])
    try:
        data, _lines = parse_yaml(f"[{raw}]", "--sweep")
    except SpecError as exc:
        raise SpecError([_error("LG020", "--sweep", f"`{item}`: {i.message}", fix, None, None)
                         for i in exc.issues]) from None
    if not isinstance(data, list) or not data:
        raise SpecError([_error("LG020", "--sweep", f"`{item}`: no values", fix, None, None)])
    return path, [_number(v) for v in data]


def _number(v: Any) -> Any:
    if isinstance(v, list):
        return [_number(x) for x in v]
    return float(v) if isinstance(v, str) and _EXPONENT_FLOAT.fullmatch(v) else v


def _combinations(section: SweepSection) -> list[tuple[tuple[str, Any], ...]]:
    grid = list(section.grid.items())
    extras = section.points or [{}]
    return [(*zip([p for p, _ in grid], combo, strict=True), *extra.items())
            for extra in extras for combo in itertools.product(*(vs for _, vs in grid))]


def _section_issues(section: SweepSection, lines: dict[LinePath, int], file: str | None) -> list[Issue]:
    issues = []
    where: list[tuple[str, LinePath]] = [(p, (KEY, "grid", p)) for p in section.grid]
    where += [(p, (KEY, "points", i, p)) for i, pt in enumerate(section.points) for p in pt]
    for p, loc in where:
        bad = path_problem(p)
        if bad is not None:
            issues.append(_error("LG020", f"{KEY}.{'.'.join(map(str, loc[1:-1]))}", *bad, lines.get(loc), file))
    for i, pt in enumerate(section.points):
        for p in sorted(set(pt) & set(section.grid)):
            issues.append(_error("LG021", f"{KEY}.points.{i}", f"`{p}` is set by the grid and by point {i}",
                                 "Set each path in one place: the grid or the points.", lines.get((KEY, "points", i)),
                                 file))
    count = math.prod(len(v) for v in section.grid.values()) * max(1, len(section.points))
    if count > MAX_POINTS:
        issues.append(_error("LG022", KEY, f"the sweep has {count} points; at most {MAX_POINTS} (SLURM's default "
                             "MaxArraySize) are rendered", "Sweep fewer values, or split the sweep into several "
                             "specs.", lines.get((KEY,)), file))
    elif not section.grid and not section.points:
        issues.append(_error("LG021", KEY, "the sweep sets nothing", "Give sweep.grid or sweep.points, or "
                             "remove the section.", lines.get((KEY,)), file))
    return issues


def _value_line(lines: dict[LinePath, int], path: str, section: SweepSection, values: dict[str, Any],
                extra_index: int) -> int | None:
    if path in section.grid:
        i = next((k for k, v in enumerate(section.grid[path]) if v == values[path]), None)
        return lines.get((KEY, "grid", path, i)) if i is not None and (KEY, "grid", path, i) in lines \
            else lines.get((KEY, "grid", path))
    return lines.get((KEY, "points", extra_index, path))


def _point_data(base: dict[str, Any], point: Point, max_parallel: int | None) -> dict[str, Any]:
    data = copy.deepcopy(base)
    for path, value in point.values:
        set_dotted(data, path.split("."), copy.deepcopy(value), what=f"{KEY} {path}")
    job = data.get("job") if isinstance(data.get("job"), dict) else None
    if job is not None:
        out = job.get("output_dir", JobSection.model_fields["output_dir"].default)
        if isinstance(out, str):
            job["output_dir"] = outdir.for_point(out, point.name)
        slurm = data.get("slurm")
        # points that may share a machine get their own ports: the job-id offset differs per array task, and a
        # --bash driver running points side by side gives each its slot's
        shared = isinstance(slurm, dict) and slurm.get("exclusive") is False
        if (shared or (max_parallel or 1) > 1) and "port_offset" not in job:
            job["port_offset"] = "job_id"
    return data


def _label(issue: Issue, point: Point) -> Issue:
    return Issue(issue.code, issue.path, f"point {point.name}: {issue.message}", issue.fix, issue.severity,
                 issue.line, issue.file)


def load_sweep(sd: SpecData, cli: Sequence[str] = ()) -> Sweep:
    """The sweep of a read spec: every point, loaded (or with the issues that stop it). SpecError for a sweep
    section that cannot be expanded."""
    raw = sd.data.get(KEY)
    file = sd.file
    try:
        section = SweepSection.model_validate(raw if raw is not None else {})
    except ValidationError as exc:
        raise SpecError(issues_from_validation(exc, sd.lines, file, (KEY,), SweepSection)) from None
    for item in cli:
        path, values = parse_cli(item)
        section.grid[path] = values
    problems = _section_issues(section, sd.lines, file)
    if problems:
        raise SpecError(problems)
    combos = _combinations(section)
    dup = {json.dumps(c, sort_keys=True, default=str) for c in combos}
    if len(dup) < len(combos):
        raise SpecError([_error("LG021", KEY, "two points of the sweep set the same values",
                                "Remove the repeated value or point.", sd.lines.get((KEY,)), file)])
    names = name_points(combos)
    base = {k: v for k, v in sd.data.items() if k != KEY}
    n_grid = math.prod(len(v) for v in section.grid.values())
    out = []
    for i, (combo, name) in enumerate(zip(combos, names, strict=True)):
        point = Point(i, name, combo)
        point_values = dict(combo)
        lines = {k: v for k, v in sd.lines.items() if k[:1] != (KEY,)}
        for path in point_values:
            line = _value_line(sd.lines, path, section, point_values, i // n_grid)
            if line is not None:
                lines[tuple(int(p) if p.isdigit() else p for p in path.split("."))] = line
        try:
            data = _point_data(base, point, section.max_parallel)
            loaded = validate_spec_data(SpecData(data, sd.text, file, lines, sd.root, list(sd.warnings)))
        except SpecError as exc:
            out.append(PointSpec(point, None, list(exc.issues)))
            continue
        except ValueError as exc:
            out.append(PointSpec(point, None, [_error("LG020", KEY, str(exc), "Sweep a path the spec can hold.",
                                                      sd.lines.get((KEY,)), file)]))
            continue
        out.append(PointSpec(point, loaded))
    return Sweep(file or "<spec>", out, section.max_parallel, tuple(cli), sd.lines.get((KEY,)))


def load(sd: SpecData, cli: Sequence[str] = ()) -> LoadedSpec | Sweep:
    """A read spec -> one job (`LoadedSpec`) or, with a `sweep:` section or --sweep options, a `Sweep`."""
    if KEY in sd.data or cli:
        return load_sweep(sd, cli)
    return validate_spec_data(sd)


def merge_issues(per_point: Sequence[tuple[Point, list[Issue]]]) -> list[Issue]:
    """Every point's issues: one that every point has is printed once, as it is (it is the spec's own); the
    others once per point, labelled with the point."""
    keyed = [(pt, {(i.code, i.path, i.message, i.line): i for i in issues}) for pt, issues in per_point]
    common = set.intersection(*(set(k) for _pt, k in keyed)) if keyed else set()
    out = [keyed[0][1][k] for k in keyed[0][1] if k in common] if keyed else []
    for pt, k in keyed:
        out += [_label(i, pt) for key, i in k.items() if key not in common]
    return out
