"""Validation: a grid file's tables and keys checked against the schema and the registry, and one
cell's raw tables resolved into a validated Cell (or every problem found)."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import re
import unicodedata
from pathlib import Path
from typing import Any

from ..contracts.config import (
    CONFIG_FORMAT,
    SCALES,
    SECTIONS,
    Cell,
    ModelConfig,
    TRAIN_KEYS_NOT_HASHED,
    TrainConfig,
    run_id_of,
    section_params,
    stored_components,
    stored_model,
)
from .. import files
from ..contracts.registry import AXES, Registry, RegistryError
from ..data.tasks import is_task_factory, resolve_probes
from .labels import grid_label


def _suggest(word: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(word, valid, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def known_path(path: str, registry: Registry) -> str | None:
    """None if ``path`` names a settable key, else an error message."""
    parts = path.split(".")
    head = parts[0]
    if head in SECTIONS:
        if len(parts) != 2:
            return f"{path!r}: expected {head}.<key>"
        keys = list(section_params(SECTIONS[head]))
        if parts[1] not in keys:
            return f"unknown key {path!r}{_suggest(parts[1], keys)} (valid: {', '.join(keys)})"
        return None
    if head in AXES:
        if len(parts) != 3:
            return f"{path!r}: component parameters are written {head}.<name>.<param>"
        try:
            comp = registry.get(head, parts[1])
        except RegistryError as exc:
            return f"{path!r}: {exc}"
        if parts[2] not in comp.params:
            valid = sorted(comp.params)
            return (
                f"{path!r}: {head} {parts[1]!r} has no parameter {parts[2]!r}"
                f"{_suggest(parts[2], valid)} (valid: {', '.join(valid) or 'none'})"
            )
        return None
    valid = list(SECTIONS) + list(AXES) + ["grid"]
    return f"unknown table {head!r}{_suggest(head, valid)} (valid tables: {', '.join(valid)})"


def check_structure(raw: dict, registry: Registry) -> list[str]:
    errs: list[str] = []
    for key, value in raw.items():
        if key in ("grid", "ladder"):  # abl.grid.validation.parse_grid and abl.grid.ladder.parse_ladder
            continue
        if key in SECTIONS:
            if not isinstance(value, dict):
                errs.append(f"[{key}] must be a table")
                continue
            for k in value:
                msg = known_path(f"{key}.{k}", registry)
                if msg:
                    errs.append(msg)
        elif key in AXES:
            if not isinstance(value, dict):
                errs.append(f"[{key}] must be a table of component names")
                continue
            for name, params in value.items():
                if not isinstance(params, dict):
                    errs.append(f"{key}.{name}: expected a table of parameters, e.g. [{key}.{name}]")
                    continue
                for p in params:
                    msg = known_path(f"{key}.{name}.{p}", registry)
                    if msg:
                        errs.append(msg)
        else:
            errs.append(known_path(key, registry) or f"unknown table {key!r}")
    return errs


def parse_grid(raw: dict, registry: Registry) -> tuple[dict[str, list], list[dict], list[str]]:
    grid = raw.get("grid", {})
    errs: list[str] = []
    if not isinstance(grid, dict):
        return {}, [], ["[grid] must be a table of dotted paths to lists"]
    axes: dict[str, list] = {}
    excludes: list[dict] = []
    for path, values in grid.items():
        if path == "exclude":
            if not isinstance(values, list) or not all(isinstance(v, dict) for v in values):
                errs.append('grid.exclude must be a list of tables, e.g. [{"model.norm" = "none"}]')
                continue
            for ex in values:
                for p in ex:
                    msg = known_path(p, registry)
                    if msg:
                        errs.append(f"grid.exclude: {msg}")
            excludes = values
            continue
        if isinstance(values, dict):
            errs.append(
                f"grid key {path!r} is a table; quote dotted paths: \"{path}.<key>\" = [...]"
            )
            continue
        msg = known_path(path, registry)
        if msg:
            errs.append(f"grid: {msg}")
            continue
        if not isinstance(values, list) or not values:
            errs.append(f"grid {path!r} must be a non-empty list of values")
            continue
        axes[path] = values
    return axes, excludes, errs


def check_output_path(key: str, value: str) -> list[str]:
    """An output path named in a grid file must stay inside the working directory (abl.files.confined)."""
    try:
        files.confined(Path.cwd(), value, key)
    except files.PathRefused as exc:
        return [f"{exc} (or pass --db on the command line)"]
    return []


def name_errors(section: str, values: dict[str, Any]) -> list[str]:
    """``experiment.name`` names the report's folder (reports/<name>/ beside the store): it must stay a
    name inside that folder (no absolute path, no '..' out of it, no component over 255 bytes)."""
    name = values.get("name")
    if section != "experiment" or not isinstance(name, str):
        return []
    try:
        files.confined(Path("reports"), name, "experiment.name (the report's folder, reports/<name>/)")
    except files.PathRefused as exc:
        return [str(exc)]
    return []


# build_section's answers by (section, repr of its raw table): a grid's cells share most tables, so a
# 100,000-run grid checks each distinct table once (the dry run of such a grid stays fast)
_SECTION_MEMO: dict[tuple[str, str], tuple[dict[str, Any] | None, list[str]]] = {}
_MEMO_SIZE = 4096


def build_section(name: str, raw: dict) -> tuple[Any, list[str]]:
    """The typed config of the table ``[name]`` (a new object each call), or its problems."""
    key = (name, repr(raw))
    found = _SECTION_MEMO.get(key)
    if found is None:
        if len(_SECTION_MEMO) >= _MEMO_SIZE:
            _SECTION_MEMO.clear()
        found = _SECTION_MEMO[key] = _checked_section(name, raw)
    values, errs = found
    if values is None:
        return None, list(errs)
    return SECTIONS[name](**{k: copy.deepcopy(v) if isinstance(v, (list, dict)) else v
                             for k, v in values.items()}), []


def _checked_section(name: str, raw: dict) -> tuple[dict[str, Any] | None, list[str]]:
    cls = SECTIONS[name]
    params = section_params(cls)
    values: dict[str, Any] = {}
    errs: list[str] = []
    for key, p in params.items():
        v = raw.get(key, p.default)
        if key == "summary" and not (isinstance(v, list) and v and all(isinstance(x, str) and x for x in v)):
            errs.append(f"experiment.summary must be a non-empty list of metric names, got {v!r}")
            continue
        if key == "seeds":
            if not isinstance(v, list) or not v or not all(
                isinstance(s, int) and not isinstance(s, bool) for s in v
            ):
                errs.append(f"experiment.seeds must be a non-empty list of integers, got {v!r}")
            elif len(set(v)) != len(v):
                errs.append(f"experiment.seeds has duplicates: {v!r}")
            else:
                errs += seed_errors(v)
        else:
            for msg in p.check(key, v):
                errs.append(f"{name}.{msg}")
        if isinstance(v, int) and not isinstance(v, bool) and p.resolved_type() is float:
            v = float(v)
        values[key] = v
    errs += control_character_errors(name, values)
    errs += name_errors(name, values)
    if errs:
        return None, errs
    return copy.deepcopy(values), []


def seed_errors(seeds: list[int]) -> list[str]:
    """Seeds are non-negative (docs/robustness.md): numpy's generators refuse a negative seed and
    torch folds one into 2**64 + seed, so ``-1`` would not name one reproducible stream everywhere."""
    neg = [s for s in seeds if s < 0]
    return [f"experiment.seeds must be >= 0, got {neg[0]} (numpy's generators take no negative seed)"] if neg else []


# text that names things (experiment.name is a store key, printed in every table): no control characters
NAMING_TEXT = ("name", "db", "baseline")


def control_character_errors(section: str, values: dict[str, Any]) -> list[str]:
    """A string of a section that holds a control character (NUL, newline, escape, ...): refused, because
    it would be printed raw into the terminal and stored. Free text (``description``) may hold line
    breaks and tabs, nothing else."""
    errs = []
    for key, v in values.items():
        if not isinstance(v, str):
            continue
        allowed = "" if key in NAMING_TEXT else "\n\t"
        bad = [ch for ch in v if unicodedata.category(ch) in ("Cc", "Cs") and ch not in allowed
               or ch in "\u2028\u2029"]
        if bad:
            errs.append(f"{section}.{key} holds a control character ({bad[0]!a}); "
                        f"got {ascii(v)[:80]}")
    return errs


def _selector(axis: str, sections: dict[str, Any]) -> str:
    sec, key = AXES[axis][0].split(".")
    return getattr(sections[sec], key)


_FIELDS: dict[type, tuple[str, ...]] = {}


def _as_dict(obj: Any) -> dict[str, Any]:
    """``dataclasses.asdict`` of a flat section config (its fields hold plain values, lists and tables),
    without asdict's recursion over every value: the resolution of each cell of a large grid calls it."""
    names = _FIELDS.get(type(obj))
    if names is None:
        names = _FIELDS[type(obj)] = tuple(f.name for f in dataclasses.fields(obj))
    out = {}
    for name in names:
        v = getattr(obj, name)
        out[name] = copy.deepcopy(v) if isinstance(v, (list, dict)) else v
    return out


def _train_config(tc: TrainConfig) -> dict[str, Any]:
    """``[train]`` as stored and hashed; an empty ``lr_sweep`` is left out, and ``lr_tuning_seeds`` at its
    default (1) or without a sweep, so run ids from before they existed stay the same."""
    out = _as_dict(tc)
    if not out["lr_sweep"]:
        del out["lr_sweep"]
    if out["lr_tuning_seeds"] == 1 or "lr_sweep" not in out:
        del out["lr_tuning_seeds"]
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    for key in TRAIN_KEYS_NOT_HASHED:  # how long abl waits on the cell: left out at the default
        if out[key] == defaults[key]:
            del out[key]
    return out


def _data_config(dc) -> dict[str, Any]:
    """``[data]`` as stored and hashed; ``accept_lossy_tokenizer`` left out at its default (false), so
    run ids from before it existed stay the same."""
    out = _as_dict(dc)
    if not out["accept_lossy_tokenizer"]:
        del out["accept_lossy_tokenizer"]
    return out


def head_dim_errors(model: ModelConfig, train: TrainConfig, given: dict) -> list[str]:
    """``model.head_dim``: derived (d_model must then split into the heads) or given, and within
    what the FlashAttention kernel handles when ``train.kernels = "triton"`` asks for it."""
    from ..kernels import FLASH_ATTENTION_MAX_HEAD_DIM as max_dim

    if not given.get("head_dim") and model.d_model % model.n_heads:
        return [f"model.d_model={model.d_model} is not divisible by model.n_heads={model.n_heads}; "
                "set model.head_dim to choose the head width independently"]
    if train.kernels == "triton" and model.head_dim > max_dim:
        return [f"model.head_dim={model.head_dim} exceeds {max_dim}, the widest head the FlashAttention "
                "kernel takes (train.kernels = 'triton'); use a head_dim of at most "
                f"{max_dim} or train.kernels = 'torch'"]
    return []


def typed_sections(raw: dict) -> tuple[dict[str, Any], list[str]]:
    """Each table of the cell ([experiment], [model], ...) as its typed config."""
    errs: list[str] = []
    sections: dict[str, Any] = {}
    for name in SECTIONS:
        sub = raw.get(name, {})
        obj, e = build_section(name, sub if isinstance(sub, dict) else {})
        errs += e
        sections[name] = obj
    return sections, errs


def derive_sizes(raw: dict, model: ModelConfig, tc: TrainConfig) -> list[str]:
    """Apply ``model.scale`` and ``train.tokens``, and check the sizes and devices that depend on them."""
    errs: list[str] = []
    given_model: dict = raw["model"] if isinstance(raw.get("model"), dict) else {}
    if model.scale:
        if model.scale not in SCALES:
            errs.append(f"model.scale {model.scale!r} is not a preset; valid: {', '.join(SCALES)}")
        else:
            model.d_model, model.n_layers, model.n_heads = SCALES[model.scale]
            model.derive_defaults(rederive=[k for k in ("head_dim", "init_std") if not given_model.get(k)])
    if tc.tokens:
        if isinstance(raw.get("train"), dict) and "steps" in raw["train"]:
            errs.append("give train.steps or train.tokens, not both")
        tc.steps = -(-tc.tokens // (tc.batch_size * model.context))
    errs += head_dim_errors(model, tc, given_model)
    if tc.batch_size % tc.devices:
        errs.append(f"train.batch_size={tc.batch_size} is not divisible by train.devices={tc.devices}")
    if tc.compile and tc.devices > 1:
        errs.append("train.compile = true needs train.devices = 1 (the compiled path is one process)")
    dev = tc.device
    if not (dev in ("auto", "cpu", "cuda") or (dev.startswith("cuda:") and dev[5:].isdigit())):
        errs.append(f"train.device must be auto, cpu, cuda or cuda:N, got {dev!r}")
    return errs


def _component(raw: dict, axis: str, name: str, registry: Registry, where: str) -> tuple[dict | None, list[str]]:
    """{"name", "params"} of one chosen component, its parameters resolved from ``[axis.name]``."""
    try:
        comp = registry.get(axis, name)
    except RegistryError as exc:
        return None, [f"{where}: {exc}"]
    given = raw.get(axis, {}).get(name, {}) if isinstance(raw.get(axis), dict) else {}
    params, errs = comp.resolve_params(given, f"{axis}.{name}")
    return {"name": name, "params": params}, errs


def _memo_component(raw: dict, axis: str, name: str, registry: Registry, where: str,
                    memo: dict | None) -> tuple[dict | None, list[str]]:
    """``_component``, answered once per distinct (axis, name, parameters given) of one expansion."""
    if memo is None:
        return _component(raw, axis, name, registry, where)
    given = raw.get(axis, {}).get(name, {}) if isinstance(raw.get(axis), dict) else {}
    key = ("component", axis, name, where, repr(given))
    if key not in memo:
        memo[key] = _component(raw, axis, name, registry, where)
    spec, errs = memo[key]
    if spec is not None:  # a new spec each cell: its parameters' lists and tables copied
        spec = {"name": spec["name"], "params": {k: copy.deepcopy(v) if isinstance(v, (list, dict)) else v
                                                 for k, v in spec["params"].items()}}
    return spec, list(errs)


def _components(raw: dict, sections: dict[str, Any], registry: Registry,
                memo: dict | None = None) -> tuple[dict[str, Any], list[str]]:
    """The component of every axis, and the per-layer mixers of ``model.layer_pattern``."""
    errs: list[str] = []
    components: dict[str, Any] = {}
    for axis in AXES:
        spec, e = _memo_component(raw, axis, _selector(axis, sections), registry, AXES[axis][0], memo)
        errs += e
        if spec is not None:
            components[axis] = spec
    model: ModelConfig = sections["model"]
    pattern = [n.strip() for n in model.layer_pattern.split(",") if n.strip()]
    if pattern:
        if model.n_layers % len(pattern):
            errs.append(f"model.layer_pattern has {len(pattern)} entries; model.n_layers="
                        f"{model.n_layers} must be a multiple of it")
        specs: dict[str, dict[str, Any]] = {}
        for name in dict.fromkeys(pattern):
            spec, e = _memo_component(raw, "mixer", name, registry, "model.layer_pattern", memo)
            errs += e
            if spec is not None:
                specs[name] = spec
        if not errs:
            components["layer_mixers"] = [specs[n] for n in model.layer_mixer_names()]
    return components, errs


def _cross_axis_errors(components: dict[str, Any], model: ModelConfig, registry: Registry) -> list[str]:
    """The checks the components declare themselves (``register(..., check=)``), across axes."""
    errs: list[str] = []
    checked = [(axis, spec) for axis, spec in components.items() if axis in AXES]
    checked += [("mixer", spec) for spec in {s["name"]: s for s in components.get("layer_mixers", [])}.values()]
    for axis, spec in checked:
        comp = registry.get(axis, spec["name"])
        if comp.check is not None:
            for msg in registry.call_with_position(comp.check, model, spec["params"]) or []:
                errs.append(f"{axis} {spec['name']!r}: {msg}")
    return errs


def extrapolation_errors(components: dict[str, Any], eval_config: Any, registry: Registry) -> list[str]:
    """``eval.extrapolation`` scores text at longer contexts; a task's val_loss is on its answer positions
    only, so the longer windows would record a different quantity: refused before anything trains."""
    dataset = components.get("dataset", {}).get("name")
    if not eval_config.extrapolation or dataset is None:
        return []
    if not is_task_factory(registry.get("dataset", dataset).factory):
        return []
    return [f"eval.extrapolation = true: dataset {dataset!r} is a task, whose val_loss is taken on its answer "
            "positions only, so val_loss_x1/x2/x4 over every position of longer windows would measure something "
            "else; set eval.extrapolation = false (a task's accuracy at another length: a grid over model.context)"]


def _resolved_config(sections: dict[str, Any], seed: int, components: dict[str, Any],
                     probes: list) -> dict[str, Any]:
    """The resolved config as stored in the run folder (abl.contracts.config: each component named once)."""
    config = {
        "format": CONFIG_FORMAT,
        "experiment": sections["experiment"].name,
        "seed": seed,
        "model": stored_model(sections["model"]),
        "train": _train_config(sections["train"]),
        "data": _data_config(sections["data"]),
        "eval": {k: v for k, v in _as_dict(sections["eval"]).items()
                 if k != "probes" or v},  # no probes: the run ids stay as before eval.probes existed
        "components": stored_components(components),
    }
    if probes:
        config["probes"] = probes
    return config


def resolve_cell(raw: dict, seed: int, varied: dict[str, Any], registry: Registry,
                 memo: dict | None = None, label: str | None = None) -> tuple[Cell | None, list[str]]:
    """Turn one cell's raw dict into a validated Cell (or error messages): typed sections, derived
    sizes, components, probes, then the components' own cross-axis checks. ``memo``, one dict for the
    cells of one expansion, keeps the components' resolved parameters, which most cells share."""
    sections, errs = typed_sections(raw)
    if errs:
        return None, errs
    model: ModelConfig = sections["model"]
    errs += derive_sizes(raw, model, sections["train"])
    components, e = _components(raw, sections, registry, memo)
    errs += e
    probes, e = resolve_probes(raw, sections["eval"].probes, model, registry)
    errs += e
    if errs:
        return None, errs
    errs = _cross_axis_errors(components, model, registry) + extrapolation_errors(components, sections["eval"],
                                                                                   registry)
    if errs:
        return None, errs
    config = _resolved_config(sections, seed, components, probes)
    cell = Cell(config=config, run_id=run_id_of(config), experiment=sections["experiment"], model=model,
                train=sections["train"], data=sections["data"], seed=seed, components=components, varied=varied,
                eval=sections["eval"], label=grid_label(varied) if label is None else label)
    return cell, []


_CELL_MESSAGE = re.compile(r"^(?P<pre>.*?)cell \[(?P<label>.*?)\]: (?P<msg>.+)$", re.DOTALL)
SHOWN_CELLS = 3  # a problem shared by more cells names this many of them, then how many more


def one_per_problem(messages: list[str], n_cells: int | None = None) -> list[str]:
    """Messages about single cells (``... cell [LABEL]: PROBLEM``) merged into one per problem.

    The same problem in several cells is one line that says where: ``PROBLEM (in every cell)``
    when ``n_cells`` says there are that many, else ``PROBLEM (in 2 cells: a; b)`` or the first
    few and how many more. Other messages pass unchanged; order is that of first appearance;
    exact repeats are dropped.
    """
    groups: dict[tuple[str, str], list[str]] = {}
    order: list[tuple[str, str] | str] = []
    for m in messages:
        hit = _CELL_MESSAGE.match(m)
        if hit is None:
            if m not in order:
                order.append(m)
            continue
        key = (hit["pre"], hit["msg"])
        if key not in groups:
            groups[key] = []
            order.append(key)
        if hit["label"] not in groups[key]:
            groups[key].append(hit["label"])
    out = []
    for item in order:
        if isinstance(item, str):
            out.append(item)
            continue
        labels = groups[item]
        pre, msg = item
        if len(labels) == 1:
            out.append(f"{pre}cell [{labels[0]}]: {msg}")
        elif n_cells is not None and len(labels) >= n_cells:
            out.append(f"{pre}{msg} (in every cell)")
        else:
            shown = "; ".join(labels[:SHOWN_CELLS])
            more = f"; and {len(labels) - SHOWN_CELLS} more" if len(labels) > SHOWN_CELLS else ""
            out.append(f"{pre}{msg} (in {len(labels)} cells: {shown}{more})")
    return out
