"""The run config of `python -m launchgen.trainers.trl` from a spec whose `train.trainer` is `trl.<name>`.

`train.args` holds TRL's own config fields (GRPOConfig, ...) beside launchgen's keys (`data`, `eval_data`,
`rewards`, `resume`, `save_final_model`); launchgen fills the TRL fields the topology owns (`TRL_OWNED`). A user
value equal to launchgen's is accepted (a TRL config carried over as it is); one that differs is LG921, naming
both fields. Unknown TRL fields and values of the wrong kind are LG901 with the YAML line, found in the generated
field table (`launchgen.trainers.declarations.trl.fields`): nothing here imports torch, transformers or trl.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, get_args

from pydantic import ValidationError

from launchgen.input import trlnames
from launchgen.input.loader import LoadedSpec, issues_from_validation
from launchgen.input.spec import Spec
from launchgen.kinds.ownership import COLOCATE_GPU_MEMORY_DEFAULT, lookup, vllm_mode
from launchgen.planning.model import HEALTH_CLIENT_MARGIN_S
from launchgen.shared.issues import Issue, SpecError
from launchgen.trainers.declarations.trl.config import TrlRunConfig
from launchgen.trainers.declarations.trl.entries import (
    GENERATION_FIELDS,
    LAUNCHGEN_KEYS,
    PREFIX,
    TRL_ENTRIES,
    TRL_GONE,
    TRL_VERSION,
    TrlEntry,
    generation_field,
)
from launchgen.trainers.declarations.trl.fields import coerce, fields_of, problems

#: A `TrlOwned.value` that leaves the field to TRL's own default.
SKIP = object()
_PRECISION = {"bf16": (True, False), "fp16": (False, True), "fp32": (False, False)}


def _bare(trainer: str) -> str:
    """`grpo` for `trl.grpo` (entries.TRL_ENTRIES is keyed by the bare name)."""
    return trainer.removeprefix(PREFIX)


@dataclass(frozen=True)
class Topology:
    spec: Spec
    precision: str  # resolved (launchgen.shared.precision.resolve_precision)
    output_dir: str  # the trainer's output_dir pattern (the script replaces it at run time)

    @property
    def mode(self) -> str:
        return vllm_mode(self.spec)


@dataclass(frozen=True)
class TrlOwned:
    field: str  # TRL's field (a dotted path into model_init_kwargs for the model's loading options)
    owner: str  # the spec field that decides it
    value: Callable[[Topology], Any]  # SKIP: not written
    modes: tuple[str, ...] = ("server", "colocate", "none")


def _colocate_memory(t: Topology) -> Any:
    v = t.spec.vllm
    assert v is not None
    return v.gpu_memory_utilization if "gpu_memory_utilization" in v.model_fields_set else COLOCATE_GPU_MEMORY_DEFAULT


def _vllm(t: Topology) -> Any:
    assert t.spec.vllm is not None  # the rows' modes name only modes with a vllm section
    return t.spec.vllm


def _or_skip(value: Any) -> Any:
    return SKIP if value is None else value


def _checkpointing(t: Topology) -> bool:
    """TRL has no `auto`, and launchgen does not estimate TRL's trainers: under `auto` the TRL config's own value
    (a config carried over as it is), else TRL's default, on."""
    value = t.spec.train.gradient_checkpointing
    if value != "auto":
        return value
    user = t.spec.train.args.get("gradient_checkpointing")
    return user if isinstance(user, bool) else True


_VLLM_MODES = ("server", "colocate")
_RESOLVED = "vllm.port / vllm.bind (the job resolves the server's address at run time)"

#: The TRL fields the topology owns, and the value launchgen writes (in the vllm modes listed; a field the
#: trainer's TRL config does not have is skipped).
TRL_OWNED: tuple[TrlOwned, ...] = (
    TrlOwned("output_dir", "job.output_dir", lambda t: t.output_dir),
    TrlOwned("use_cpu", "train.device", lambda t: t.spec.train.device == "cpu"),
    TrlOwned("bf16", "train.precision", lambda t: _PRECISION[t.precision][0]),
    TrlOwned("fp16", "train.precision", lambda t: _PRECISION[t.precision][1]),
    TrlOwned("use_liger_kernel", "train.use_liger_kernel", lambda t: t.spec.train.use_liger_kernel),
    TrlOwned("gradient_checkpointing", "train.gradient_checkpointing", _checkpointing),
    TrlOwned("trust_remote_code", "model.trust_remote_code", lambda t: t.spec.model.trust_remote_code),
    TrlOwned("model_init_kwargs.trust_remote_code", "model.trust_remote_code",
             lambda t: t.spec.model.trust_remote_code),
    TrlOwned("model_init_kwargs.revision", "model.revision", lambda t: _or_skip(t.spec.model.revision)),
    TrlOwned("model_init_kwargs.dtype", "model.dtype", lambda t: t.spec.model.dtype),
    TrlOwned("model_init_kwargs.attn_implementation", "train.attn_implementation",
             lambda t: _or_skip(t.spec.train.attn_implementation)),
    TrlOwned("use_vllm", "vllm (a `vllm:` section turns it on)", lambda t: t.mode != "none"),
    TrlOwned("vllm_mode", "vllm.mode", lambda t: t.mode, _VLLM_MODES),
    TrlOwned("vllm_server_base_url", _RESOLVED, lambda t: SKIP, ("server",)),
    TrlOwned("vllm_server_host", _RESOLVED, lambda t: SKIP, ("server",)),
    TrlOwned("vllm_server_port", "vllm.port", lambda t: SKIP, ("server",)),
    TrlOwned("vllm_group_port", "vllm.group_port", lambda t: SKIP, ("server",)),
    # longer than the supervisor's wait, so that the supervisor, which names the server's log, reports it
    TrlOwned("vllm_server_timeout", f"vllm.health_timeout (+ {HEALTH_CLIENT_MARGIN_S} s)",
             lambda t: float(_vllm(t).health_timeout + HEALTH_CLIENT_MARGIN_S), ("server",)),
    TrlOwned("vllm_tensor_parallel_size", "vllm.tensor_parallel_size", lambda t: _vllm(t).tensor_parallel_size,
             ("colocate",)),
    TrlOwned("vllm_gpu_memory_utilization", "vllm.gpu_memory_utilization", _colocate_memory, ("colocate",)),
    TrlOwned("vllm_enable_sleep_mode", "vllm.enable_sleep_mode", lambda t: _vllm(t).enable_sleep_mode,
             ("colocate",)),
    TrlOwned("vllm_max_model_length", "vllm.max_model_len", lambda t: _or_skip(_vllm(t).max_model_len),
             ("colocate",)),
)


def _set(args: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    node = args
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[leaf] = value


def _applies(row: TrlOwned, entry: TrlEntry, mode: str) -> bool:
    return mode in row.modes and row.field.split(".")[0] in fields_of(entry.name)


def _same(user: Any, ours: Any) -> bool:
    if isinstance(ours, float) and isinstance(user, (int, float)) and not isinstance(user, bool):
        return float(user) == ours
    return bool(user == ours) and type(user) is type(ours)


def _topology_refusals(spec: Spec, name: str) -> list[Issue]:
    """What this TRL trainer cannot run in the spec's topology (LG920)."""
    entry = TRL_ENTRIES[name]
    v, out = spec.vllm, []
    if entry.vllm == "server" and (v is None or v.mode != "server"):
        out.append(Issue("LG920", "vllm.mode", f"trl.{name} generates on a vLLM server only (TRL's "
                         f"{entry.config_class})", "Add a `vllm:` section with mode: server."))
    if entry.cuda_only is not None and spec.train.device == "cpu":
        out.append(Issue("LG920", "train.device", f"trl.{name} cannot train on a CPU: TRL {TRL_VERSION}'s "
                         f"{entry.trainer.rpartition(':')[2]}: {entry.cuda_only}",
                         "Use train.device: cuda with a GPU vLLM server, or trl.grpo / grpo on a CPU."))
    for field, why in entry.refuses:
        if getattr(spec.train, field) not in (None, False):
            out.append(Issue("LG920", f"train.{field}", f"trl.{name} cannot take train.{field}: {why}",
                             f"Remove train.{field}, or use trl.grpo / grpo."))
    if v is not None and v.mode == "server" and v.replicas > 1:
        out.append(Issue("LG920", "vllm.replicas", f"TRL's client talks to one server; vllm.replicas is "
                         f"{v.replicas} with trl.{name}",
                         "Use vllm.replicas: 1 (or the bundled trainer, which spreads prompts over replicas)."))
    return out


def translated_generation(args: Mapping[str, Any], name: str) -> tuple[dict[str, Any], list[Issue]]:
    """The bundled trainers' `generation:` settings as TRL fields, and LG901 for what has no TRL field or is
    set twice."""
    gen = args.get("generation", {})
    if not isinstance(gen, Mapping):
        return {}, [Issue("LG901", "train.args.generation", "must be a mapping",
                          "Write TRL's generation fields directly in train.args, or `generation:` as a mapping.")]
    fields, out, issues = fields_of(name), {}, []
    for key, value in gen.items():
        trl_field = generation_field(str(key), name)
        path = f"train.args.generation.{key}"
        if trl_field is None or trl_field not in fields:
            issues.append(Issue("LG901", path, f"generation.{key} has no counterpart in TRL's "
                                f"{TRL_ENTRIES[name].config_class}",
                                "Remove it; TRL's own fields go directly in train.args (docs/trl-names.md)."))
        elif trl_field in args:
            issues.append(Issue("LG901", path, f"generation.{key} and train.args.{trl_field} set the same TRL field",
                                f"Keep one of the two (train.args.{trl_field} is TRL's name)."))
        else:
            out[trl_field] = value
    return out, issues


def _lacking(args: Mapping[str, Any], entry: TrlEntry) -> list[Issue]:
    """LG924: launchgen's data options the TRL trainer has no counterpart for (the run config refuses them too)."""
    out = []
    for section in ("data", "eval_data"):
        data = args.get(section)
        if entry.data == "prompt" and isinstance(data, Mapping) and data.get("max_prompt_length") is not None:
            out.append(Issue("LG924", f"train.args.{section}.max_prompt_length",
                             f"trl.{entry.name} cannot truncate prompts: TRL {TRL_VERSION}'s {entry.config_class} "
                             "has no prompt length (the bundled trainer's data.max_prompt_length)",
                             f"Remove {section}.max_prompt_length and keep the prompts short in the data, or use "
                             f"train.trainer: {entry.name} (the bundled trainer truncates them)."))
    return out


def trl_issues(spec: Spec, trainer: str, topology: Topology) -> list[Issue]:
    """LG920 (topology), LG901 (unknown TRL field, wrong kind), LG921 (contradicts the topology), unlocated."""
    name = _bare(trainer)
    refusals = _topology_refusals(spec, name)
    if refusals:
        return refusals
    entry = TRL_ENTRIES[name]
    args = spec.train.args
    gen, out = translated_generation(args, name)
    out += _lacking(args, entry)
    out += [Issue("LG901", f"train.args.{p.key}", p.message, p.fix) for p in problems(name, args)]
    out += [Issue("LG901", f"train.args.generation.{p.key}", p.message, p.fix) for p in problems(name, gen)]
    for row in TRL_OWNED:
        if not _applies(row, entry, topology.mode):
            continue
        present, user = lookup(args, row.field)
        if not present or user is None:
            continue
        ours = row.value(topology)
        if ours is SKIP:
            out.append(Issue("LG921", f"train.args.{row.field}", f"TRL's `{row.field}` is decided by {row.owner}",
                             f"Remove train.args.{row.field}; set {row.owner.split(' ')[0]} instead."))
        elif not _same(user, ours):
            out.append(Issue("LG921", f"train.args.{row.field}",
                             f"train.args.{row.field} is {user!r} but {row.owner} makes it {ours!r}",
                             f"Remove train.args.{row.field} (launchgen sets it from {row.owner.split(' ')[0]}), "
                             f"or change {row.owner.split(' ')[0]}."))
    return out


def _server(spec: Spec) -> dict[str, Any] | None:
    v = spec.vllm
    if v is None or v.mode != "server":
        return None
    # host and the ports are replaced at run time (--set server.host=... etc.); these are the base values
    return {"host": "127.0.0.1", "port": v.port, "group_port": v.group_port}


def run_config_data(spec: Spec, trainer: str, topology: Topology) -> dict[str, Any]:
    """The run config as a mapping: launchgen's keys from train.args, TRL's fields plus the owned values."""
    name = _bare(trainer)
    args = copy.deepcopy(dict(spec.train.args))
    data: dict[str, Any] = {"trainer": trainer, "model_name_or_path": spec.model.name_or_path}
    gen, _ = translated_generation(args, name)
    args.pop("generation", None)
    args.update(gen)
    for key in LAUNCHGEN_KEYS:
        if key in args:
            data[key] = args.pop(key)
    if isinstance(args.get("report_to"), list):  # launchgen's `jsonl`: metrics.jsonl is always written
        args["report_to"] = [r for r in args["report_to"] if r != "jsonl"]
    args = coerce(name, args)
    entry = TRL_ENTRIES[name]
    for row in TRL_OWNED:
        if _applies(row, entry, topology.mode) and (value := row.value(topology)) is not SKIP:
            _set(args, row.field, value)
    server = _server(spec)
    if server is not None:
        data["server"] = server
    if spec.train.script is not None:
        data.update(script=spec.train.script, script_args=list(spec.train.script_args))
    data["args"] = args
    return data


def _located(issues: list[Issue], loaded: LoadedSpec | None) -> list[Issue]:
    if loaded is None:
        return issues
    return [i if i.line is not None else i.located(loaded.path, loaded.line_of(i.path)) for i in issues]


def _validation_issues(exc: ValidationError, loaded: LoadedSpec | None) -> list[Issue]:
    """pydantic's errors of the run config, at their train.args paths."""
    lines = loaded.lines if loaded is not None else {}
    file = loaded.path if loaded is not None else None
    out = []
    for i in issues_from_validation(exc, lines, file, prefix=("train", "args"), model=TrlRunConfig):
        path = i.path.replace("train.args.args.", "train.args.")
        out.append(Issue("LG901", path, i.message, i.fix, "error", i.line, file))
    return out


def build_trl_config(spec: Spec, trainer: str, topology: Topology, loaded: LoadedSpec | None = None
                     ) -> TrlRunConfig:
    """The validated run config (the trainer's declared class); raises SpecError with every LG901/LG920/LG921
    issue."""
    from launchgen.trainers.declarations.configs import parse_trainer_config

    found = trl_issues(spec, trainer, topology)
    if found:
        raise SpecError(_located(found, loaded))
    try:
        cfg = parse_trainer_config(run_config_data(spec, trainer, topology))
        assert isinstance(cfg, TrlRunConfig)
        return cfg
    except ValidationError as exc:
        raise SpecError(_located(_validation_issues(exc, loaded), loaded)) from None


_JSON_TYPES = {"bool": "boolean", "int": "integer", "float": "number", "str": "string", "list": "array",
               "dict": "object", "null": "null"}


@cache
def _run_config_schema(defs_prefix: str) -> dict[str, Any]:
    """The sections every TRL trainer's run config shares (its classes differ in `trainer` only, which is not
    taken from here): one pydantic JSON Schema for all of them, not one each (`schema` built seven)."""
    return TrlRunConfig.model_json_schema(ref_template="#/$defs/" + defs_prefix + "{model}")


def trl_args_json_schema(model: type[TrlRunConfig], defs_prefix: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """`train.args` of a TRL trainer as JSON Schema (`launchgen schema`): its TRL config's fields from the generated
    table (types, choices, defaults), launchgen's sections from the run config's own schema, and the bundled
    `generation` keys that are TRL fields."""
    name = _bare(str(get_args(model.model_fields["trainer"].annotation)[0]))
    base = copy.deepcopy(_run_config_schema(defs_prefix))
    defs = {defs_prefix + k: v for k, v in base.pop("$defs", {}).items()}
    props: dict[str, Any] = {}
    fields = fields_of(name)
    for field, row in fields.items():
        types = [_JSON_TYPES[k] for k in row["kinds"] if k in _JSON_TYPES]
        prop: dict[str, Any] = {} if "any" in row["kinds"] else {"type": types if len(types) > 1 else types[0]}
        if "float" in row["kinds"] and "int" not in row["kinds"] and "type" in prop:  # YAML `1` is a float here
            prop["type"] = sorted({*(types if isinstance(prop["type"], list) else [prop["type"]]), "integer"})
        if "choices" in row:
            prop["enum"] = row["choices"]
        if row.get("default") is not None:
            prop["default"] = row["default"]
        props[field] = prop
    for key in LAUNCHGEN_KEYS:
        if key in base.get("properties", {}):
            props[key] = base["properties"][key]
    gen = {k: props[f] for k in GENERATION_FIELDS if (f := generation_field(k, name)) in props}
    props["generation"] = {"type": "object", "properties": gen, "additionalProperties": False,
                           "description": "The bundled trainers' generation settings that are TRL fields."}
    schema = {"title": "train.args", "type": "object", "properties": props, "additionalProperties": False,
              "description": f"TRL's {TRL_ENTRIES[name].config_class} fields (TRL {TRL_VERSION}) and launchgen's "
              "data/rewards sections."}
    return schema, defs


def markdown_section() -> str:
    """The `trl.*` / `train.script` part of docs/trl-names.md (generated with the rest of the page)."""
    out = [
        "## TRL's own trainers (`trl.<name>`) and your own TRL script (`train.script`)",
        "",
        "With `train.trainer: trl.<name>`, launchgen runs TRL's own trainer class (`python -m launchgen.trainers.trl`)",
        "and `train.args` takes the TRL config's own field names as they are, beside launchgen's `data`, `eval_data`,",
        "`rewards`, `resume` and `save_final_model` (the same sections as the bundled trainers, so one spec switches",
        "between `grpo` and `trl.grpo` by its trainer line; the bundled `generation.<key>` settings that are TRL fields",
        "are translated). `check` validates them against a table generated from TRL's dataclasses",
        f"(`launchgen/trainers/declarations/trl/fields.json`, TRL {TRL_VERSION}) without importing TRL: an unknown field gets the",
        "closest name, a wrong type the field and its YAML line (LG901).",
        "",
        "A text prompt goes through the tokenizer's chat template before TRL sees it, as in the bundled trainers (TRL",
        "alone would tokenize the bare text); the rewards still get the data file's prompt. With that, `grpo` and",
        "`trl.grpo` (and `rloo` / `trl.rloo`) drawing the same completions reach the same first-step loss, rewards",
        "and gradient norm (tests/trainers/test_trl_consistency.py).",
        "",
        "| `train.trainer` | TRL trainer | TRL config | `data` rows | vLLM |",
        "| --- | --- | --- | --- | --- |",
    ]
    vllm = {"no": "no", "optional": "server or colocate", "server": "server only"}
    rows = {"prompt": "prompts", "sft": "text / messages / prompt+completion", "preference": "prompt, chosen, rejected"}
    for name, e in TRL_ENTRIES.items():
        out.append(f"| `{PREFIX}{name}` | `{e.trainer.replace(':', '.')}` | `{e.config_class}` | {rows[e.data]} "
                   f"| {vllm[e.vllm]} |")
    for name, e in TRL_ENTRIES.items():
        if e.cuda_only is not None:
            out += ["", f"`{PREFIX}{name}` trains on GPUs only, and `check` refuses `train.device: cpu` (LG920): "
                    f"TRL {TRL_VERSION}'s {e.trainer.rpartition(':')[2]}: {e.cuda_only}. It also refuses "
                    + " and ".join(f"`train.{f}` ({why})" for f, why in e.refuses) + ". On a CPU, the job it renders "
                    "is tested up to TRL's config (tests/test_trl_render.py); the module itself exits 2 naming this."]
    out += ["", f"Not shipped by TRL {TRL_VERSION}: " + "; ".join(f"`{PREFIX}{n}` ({why})" for n, why in
                                                              TRL_GONE.items()) + ".", "",
            "### What launchgen fills in", "",
            "A field below that `train.args` also sets must agree with the spec field that decides it; a value that",
            "differs is LG921, naming both. The server's address and ports are resolved by the job script at run time.",
            "Every other field keeps TRL's own default (GRPOConfig logs every 10 steps, the bundled trainers every",
            "step: set `logging_steps: 1` for a metrics record and a `[launchgen] step` line per step).",
            "", "| TRL field | decided by | modes |", "| --- | --- | --- |"]
    for row in TRL_OWNED:
        modes = "all" if len(row.modes) == 3 else ", ".join(row.modes)
        out.append(f"| `{row.field}` | {row.owner} | {modes} |")
    out += ["", "Bundled `generation.<key>` settings read as TRL fields: "
            + ", ".join(f"`{k}`" + (" (" + ", ".join(f"{t}: `{f}`" for t, f in v.items()) + ")" if v else "")
                        for k, v in GENERATION_FIELDS.items()) + ".", "",
            "### `train.script`: your own TRL script", "",
            "`train.script` (a `.py` path or a module) runs your script under `python -m launchgen.trainers.trl.script`,",
            "which installs the lifecycle around it with no line added: every `transformers.Trainer` gets launchgen's",
            "callback (USR2/TERM -> `checkpoint-<step>` -> exit 75; `[launchgen] step` lines, and metrics.jsonl in the",
            "job's trainer directory, where `report` and `status` read it, even for a script that trains elsewhere), its",
            "`train()` resumes from the newest checkpoint of its output_dir when the script passes no",
            "`resume_from_checkpoint`, and a finished `train()` leaves the completion marker. `train.trainer: trl.<name>`",
            "names the TRL config the script parses. The job passes, in this order:",
            "",
            "1. `--<field> <value>` for every TRL field above and every `train.args` field (booleans as `true`/`false`,",
            "   lists as one word per item, mappings as JSON), when the script's source names `TrlParser` or",
            "   `HfArgumentParser`; in server mode `--vllm_server_base_url http://<host>:<port>` and",
            "   `--vllm_group_port <port>` with the run-time values;",
            "2. `--model_name_or_path`, `--dtype`, `--attn_implementation`, `--model_revision` (TRL's `ModelConfig`),",
            "   when the source names `ModelConfig`;",
            "3. `train.script_args`, verbatim.",
            "",
            "Every value is also in the environment as `LAUNCHGEN_TRL_<FIELD>` (`LAUNCHGEN_TRL_OUTPUT_DIR`,",
            "`LAUNCHGEN_TRL_VLLM_SERVER_BASE_URL`, `LAUNCHGEN_TRL_MODEL_NAME_OR_PATH`, ...), for a script that parses",
            "nothing; `check` warns (LG923) when it cannot see a parser in the script, and refuses a script that does",
            "not exist (LG922). `examples/trl_grpo_script.py` with `examples/trl-script.yaml` is one, run in CI.", ""]
    return "\n".join(out)


def names_page() -> str:
    """docs/trl-names.md: the bundled trainers' TRL names (`trlnames.markdown`), then TRL's own trainers."""
    return trlnames.markdown() + "\n\n" + markdown_section()
