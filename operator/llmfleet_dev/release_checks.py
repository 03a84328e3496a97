"""Checks of rendered workloads against the pinned releases' upstream records
(`llmfleet.catalog.release_record`): what render produces (config.pbtxt texts, commands, image
paths, metric names) is compared with the record, and each mismatch comes back as a readable
line; nothing is fixed and nothing read but the texts given. Tests hold the product to them;
the operator never runs them, so they stay out of its image.
"""

from __future__ import annotations

import ast
import re
import shlex
from typing import Any, Iterable, Mapping

from llmfleet.catalog.lws_record import LwsRecord
from llmfleet.catalog.release_record import Parameter, ReleaseRecord, Tensor

PY_BOOL_WORDS = ("true", "false", "1", "0", "t", "f", "y", "n", "yes", "no")
CPP_BOOL_WORDS = ("True", "true", "TRUE", "1", "False", "false", "FALSE", "0")


# --- a reader for the protobuf text subset that render.pbtxt writes ----------------------------------

_TOKEN = re.compile(r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<punct>[{}\[\]:,])|(?P<word>[^\s{}\[\]:,"]+))')


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens, pos = [], 0
    text = re.sub(r"(?m)#.*$", "", text)
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            if text[pos:].strip():
                raise ValueError(f"cannot read pbtxt near {text[pos:pos + 20]!r}")
            break
        pos = match.end()
        kind = match.lastgroup
        tokens.append((kind, match.group(kind)))
    return tokens


def _scalar(kind: str, value: str) -> Any:
    if kind == "str":
        return ast.literal_eval(value)
    if value in ("true", "false"):
        return value == "true"
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return float(value)
    except ValueError:
        return value  # an enum symbol such as TYPE_INT32


def _add(message: dict[str, Any], name: str, value: Any) -> None:
    if name in message:
        existing = message[name]
        if not isinstance(existing, list) or not existing or not isinstance(existing[0], dict):
            existing = [existing]
        message[name] = existing + (value if isinstance(value, list) else [value])
    else:
        message[name] = value


def _message(tokens: list[tuple[str, str]], i: int, closing: str | None) -> tuple[dict[str, Any], int]:
    message: dict[str, Any] = {}
    while i < len(tokens):
        kind, value = tokens[i]
        if closing is not None and value == closing and kind == "punct":
            return message, i + 1
        name = value
        i += 1
        if tokens[i][1] == ":":
            i += 1
        kind, value = tokens[i]
        if value == "{":
            sub, i = _message(tokens, i + 1, "}")
            _add(message, name, [sub])
        elif value == "[":
            items, i = [], i + 1
            while tokens[i][1] != "]":
                if tokens[i][1] == ",":
                    i += 1
                    continue
                if tokens[i][1] == "{":
                    sub, i = _message(tokens, i + 1, "}")
                    items.append(sub)
                else:
                    items.append(_scalar(*tokens[i]))
                    i += 1
            i += 1
            if items and all(isinstance(item, dict) for item in items):
                _add(message, name, items)
            else:
                message[name] = items
        else:
            message[name] = _scalar(kind, value)
            i += 1
    if closing is not None:
        raise ValueError("unterminated message in pbtxt")
    return message, i


def read_pbtxt(text: str) -> dict[str, Any]:
    """Parse the text format that llmfleet.render.pbtxt writes. Nested messages come back as lists of
    dicts (a field may repeat), scalars as str/int/float/bool, enum values as plain str."""
    message, _ = _message(_tokens(text), 0, None)
    return message


def _one(value: Any) -> dict[str, Any]:
    return value[0] if isinstance(value, list) else value


def _parameters(config: Mapping[str, Any]) -> dict[str, str]:
    params = {}
    for entry in config.get("parameters") or ():
        value = _one(entry.get("value", {}))
        params[entry["key"]] = value.get("string_value")
    return params


# --- checks --------------------------------------------------------------------------------------------

def _type_error(parameter: Parameter, value: Any) -> str | None:
    """Why ``value`` would not parse as the upstream code parses it, or None."""
    if not isinstance(value, str):
        return f"is not a string_value ({value!r})"
    kind = parameter.type
    if kind == "bool_cpp" and value not in CPP_BOOL_WORDS:
        return f"{value!r} is not one of {', '.join(CPP_BOOL_WORDS)}"
    if kind == "bool_py" and value.lower() not in PY_BOOL_WORDS:
        return f"{value!r} is not one of {', '.join(PY_BOOL_WORDS)} (the model falls back to its default)"
    if kind in ("int", "uint"):
        if not re.fullmatch(r"-?\d+" if kind == "int" else r"\d+", value.strip()):
            return f"{value!r} is not an integer"
    if kind == "float":
        try:
            float(value)
        except ValueError:
            return f"{value!r} is not a number"
    if kind == "int_list" and not re.fullmatch(r"\s*-?\d+\s*(,\s*-?\d+\s*)*", value):
        return f"{value!r} is not a comma-separated list of integers"
    if kind == "enum" and parameter.choices and value not in parameter.choices:
        return f"{value!r} is not one of {', '.join(parameter.choices)}"
    return None


def _dims(tensor: Mapping[str, Any]) -> tuple[int, ...]:
    dims = tensor.get("dims", [])
    return tuple(dims if isinstance(dims, list) else [dims])


def _check_tensors(model: str, direction: str, rendered: list[dict[str, Any]],
                   upstream: Mapping[str, Tensor]) -> list[str]:
    problems = []
    seen = set()
    for tensor in rendered:
        name = tensor.get("name")
        seen.add(name)
        ref = upstream.get(name)
        if ref is None:
            problems.append(f"{model}: unknown {direction} tensor {name!r} (not in the upstream config)")
            continue
        data_type = str(tensor.get("data_type"))
        if not ref.data_type.startswith("${") and data_type != ref.data_type:
            problems.append(f"{model}: {direction} {name!r} has data_type {data_type}, upstream {ref.data_type}")
        if _dims(tensor) != ref.dims:
            problems.append(f"{model}: {direction} {name!r} has dims {list(_dims(tensor))}, upstream {list(ref.dims)}")
        if direction == "input" and tensor.get("optional", False) and ref.required and not ref.optional:
            problems.append(f"{model}: input {name!r} is optional here but the model needs it")
    for name, ref in upstream.items():
        if ref.required and name not in seen:
            problems.append(f"{model}: {direction} tensor {name!r} missing (upstream needs it)")
    return problems


def check_model_config(record: ReleaseRecord, model: str, config: Mapping[str, Any]) -> list[str]:
    """Mismatches of one model's config (parsed) against the record's model of that name."""
    ref = record.models.get(model)
    if ref is None:
        return [f"{model}: no such model in the {record.release} model set ({', '.join(record.models)})"]
    problems = []
    if ref.backend and config.get("backend") != ref.backend:
        problems.append(f"{model}: backend {config.get('backend')!r}, upstream {ref.backend!r}")
    if ref.platform and config.get("platform") != ref.platform:
        problems.append(f"{model}: platform {config.get('platform')!r}, upstream {ref.platform!r}")
    params = _parameters(config)
    for key, value in params.items():
        parameter = ref.parameters.get(key)
        if parameter is None:
            problems.append(f"{model}: unknown parameter {key!r} (not read upstream)")
            continue
        if parameter.read == "refused":
            problems.append(f"{model}: parameter {key!r} is refused upstream ({parameter.note})")
            continue
        why = _type_error(parameter, value)
        if why:
            problems.append(f"{model}: parameter {key!r} has the wrong type: {why}")
    for key, parameter in ref.parameters.items():
        if parameter.read == "required" and key not in params:
            problems.append(f"{model}: required parameter {key!r} missing ({parameter.source})")
    problems += _check_tensors(model, "input", list(config.get("input") or ()), ref.inputs)
    problems += _check_tensors(model, "output", list(config.get("output") or ()), ref.outputs)
    return problems


def _check_ensemble_steps(record: ReleaseRecord, model: str, config: Mapping[str, Any],
                          repository: Mapping[str, Mapping[str, Any]]) -> list[str]:
    problems = []
    scheduling = _one(config.get("ensemble_scheduling") or {})
    for step in scheduling.get("step") or ():
        target = step.get("model_name")
        target_config = repository.get(target)
        if target_config is None:
            problems.append(f"{model}: step model {target!r} is not in the repository")
            continue
        inputs = {t["name"] for t in target_config.get("input") or ()}
        outputs = {t["name"] for t in target_config.get("output") or ()}
        for entry in step.get("input_map") or ():
            if entry["key"] not in inputs:
                problems.append(f"{model}: step {target!r} maps unknown input {entry['key']!r}")
        for entry in step.get("output_map") or ():
            if entry["key"] not in outputs:
                problems.append(f"{model}: step {target!r} maps unknown output {entry['key']!r}")
    return problems


def check_model_repository(record: ReleaseRecord, files: Mapping[str, str]) -> list[str]:
    """``files``: path -> config.pbtxt text, paths like ``tensorrt_llm/config.pbtxt`` (other files are
    ignored). The model name is the config's ``name`` (else the directory)."""
    configs: dict[str, dict[str, Any]] = {}
    for path, text in files.items():
        if not path.endswith("config.pbtxt"):
            continue
        config = read_pbtxt(text)
        name = config.get("name") or path.split("/")[0].removesuffix(".config.pbtxt")
        configs[name] = config
    problems = []
    for name, config in configs.items():
        problems += check_model_config(record, name, config)
        if config.get("platform") == "ensemble":
            problems += _check_ensemble_steps(record, name, config, configs)
    return problems


def check_image_paths(record: ReleaseRecord, paths: Iterable[str]) -> list[str]:
    problems = []
    for path in paths:
        entry = record.image_path(path)
        if entry is None:
            problems.append(f"image path {path} is not in the record (unknown whether {record.image} has it)")
        elif not entry.present:
            problems.append(f"image path {path} does not exist in {record.image} ({entry.source})")
    return problems


# Shell words in command position that run no program of the image: bash's keywords and the
# builtins the rendered scripts use.
SHELL_BUILTINS = frozenset({
    "!", "[", "[[", "((", ":", "break", "case", "cd", "continue", "do", "done", "echo", "elif", "else", "esac",
    "exec", "exit", "export", "fi", "for", "if", "in", "kill", "printf", "read", "return", "set", "shift",
    "test", "then", "trap", "true", "false", "until", "wait", "while",
})
# Keywords that, in command position, leave the next word in command position.
_KEYWORDS_BEFORE_A_COMMAND = frozenset({"!", "then", "do", "else", "elif", "if", "while", "until"})
# Programs that run the command given after their own options (and, for timeout, its duration).
_COMMAND_WRAPPERS = frozenset({"exec", "timeout"})
_SUBSTITUTION = re.compile(r"`([^`]*)`|\$\(([^()]*)\)")
_SUBSTITUTED = "$substituted"  # what a substitution's text is replaced with once read
_OPERATOR_CHARACTERS = set("();<>|&")


def script_programs(script: str) -> set[str]:
    """The programs a shell script runs by name (found on the image's PATH): the word in command
    position of each simple command, of command substitutions and of `bash -c`/`sh -c` scripts
    within; keywords and builtins left out, and programs given by path or by a variable
    (`check_image_paths` covers paths). Enough for the scripts render writes: no here-documents,
    no functions, no wrappers but `exec` and `timeout`."""
    programs: set[str] = set()
    for match in _SUBSTITUTION.finditer(script):
        programs |= script_programs(match.group(1) or match.group(2) or "")
    # Continued lines joined; a ';' after each newline ends a command there even after a comment
    # (the lexer drops a comment with its newline); inside quotes it changes no program.
    text = _SUBSTITUTION.sub(_SUBSTITUTED, script).replace("\\\n", " ").replace("\n", "\n; ")
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.commenters = "#"
    lexer.whitespace_split = True
    words = list(lexer)
    at_command, wrapped = True, False
    for index, word in enumerate(words):
        if at_command and word.startswith("(("):  # arithmetic, up to its "))"
            at_command = False
            continue
        if set(word) <= _OPERATOR_CHARACTERS:
            # A control operator (";", "&&", "|", a newline's ";"...): a command follows; a
            # redirection: its target does.
            at_command, wrapped = not set(word) & set("<>"), False
            continue
        if at_command and word in _KEYWORDS_BEFORE_A_COMMAND:
            continue
        if not at_command or re.fullmatch(r"[A-Za-z_]\w*=.*", word):
            continue
        if wrapped and (word.startswith("-") or re.fullmatch(r"[\d.]+[smhd]?", word)):
            continue
        if word not in SHELL_BUILTINS and "/" not in word and not word.startswith("$"):
            programs.add(word)
        if word in ("bash", "sh") and words[index + 1:index + 2] == ["-c"] and len(words) > index + 2:
            programs |= script_programs(words[index + 2])
        at_command = wrapped = word in _COMMAND_WRAPPERS
    return programs


def command_programs(command: list[str]) -> set[str]:
    """The programs an exec-form command runs by name: its first word, the script of a shell's
    `-c`, and each rank of an mpirun (`-n N PROGRAM`)."""
    if not command:
        return set()
    first = command[0].rsplit("/", 1)[-1]
    programs = set() if "/" in command[0] else {first}
    if first in ("bash", "sh") and command[1:2] == ["-c"] and len(command) > 2:
        programs |= script_programs(command[2])
        if '"$@"' in command[2]:  # the words after the script's own name are a command it runs
            programs |= command_programs(command[4:])
    if first == "mpirun":
        programs |= {command[index + 2] for index, word in enumerate(command[:-2])
                     if word == "-n" and "/" not in command[index + 2]}
    return programs


def check_programs(record: ReleaseRecord, programs: Iterable[str]) -> list[str]:
    """Programs a container of the release's image runs by name: each recorded present."""
    problems = []
    for name in sorted(set(programs)):
        entry = record.executables.get(name)
        if entry is None:
            problems.append(f"program {name} is not in the record (unknown whether {record.image} has it)")
        elif not entry.present:
            problems.append(f"program {name} does not exist in {record.image} ({entry.source})")
    return problems


def check_model_code_paths(record: ReleaseRecord, paths: Iterable[str]) -> list[str]:
    """Paths pods copy from the operator's image: each must be a recorded upstream file."""
    known = {file.image_path for file in record.model_code}
    return [f"{path} is not an upstream file of {record.release}'s record (model_code)"
            for path in paths if path not in known]


def _flags(args: Iterable[str]) -> list[str]:
    return [arg.split("=", 1)[0] for arg in args if arg.startswith("-")]


def check_command_flags(known: frozenset[str], tool: str, args: Iterable[str], *, complete: bool = True) -> list[str]:
    problems = []
    for flag in _flags(args):
        if flag not in known:
            if complete:
                problems.append(f"{tool}: unknown flag {flag}")
            else:
                problems.append(f"{tool}: flag {flag} not in the record (its flag list at the tag is incomplete)")
    return problems


def check_build_command(record: ReleaseRecord, args: Iterable[str]) -> list[str]:
    return check_command_flags(record.build_flags, "trtllm-build", args, complete=record.build_flags_complete)


def check_quantize_command(record: ReleaseRecord, args: Iterable[str], *, qformat: str | None = None) -> list[str]:
    problems = []
    if record.quantize_flags is None:
        problems.append("quantize.py: flags not established at the tag; cannot check " + " ".join(_flags(args)))
    else:
        problems += check_command_flags(record.quantize_flags, "quantize.py", args)
    if qformat is not None and record.qformat_values and qformat not in record.qformat_values:
        problems.append(f"quantize.py: --qformat {qformat} is not one of {', '.join(record.qformat_values)}")
    return problems


def check_tritonserver_command(record: ReleaseRecord, args: Iterable[str]) -> list[str]:
    return check_command_flags(record.tritonserver_flags, "tritonserver", args)


def check_mpirun_command(record: ReleaseRecord, argv: list[str], tensorrt_llm_model: str) -> list[str]:
    """An MPMD `mpirun [flags] -n 1 tritonserver ... : -n 1 tritonserver ...` against the record:
    mpirun's flags, each rank's server flags, and the per-rank flags upstream's launcher gives."""
    if not argv or argv[0] != "mpirun":
        return [f"not an mpirun command: {argv[:1]}"]
    contexts: list[list[str]] = [[]]
    for arg in argv[1:]:
        if arg == ":":
            contexts.append([])
        else:
            contexts[-1].append(arg)
    problems = []
    for rank, context in enumerate(contexts):
        if "-n" not in context or context.index("-n") + 2 > len(context):
            problems.append(f"mpirun: app context {rank} has no '-n <count> <program>'")
            continue
        at = context.index("-n")
        mpirun_args, count, server = context[:at], context[at + 1], context[at + 2:]
        problems += check_command_flags(record.mpirun_flags, "mpirun", mpirun_args + ["-n"])
        if count != "1":
            problems.append(f"mpirun: app context {rank} starts {count} processes; one rank per context")
        problems += check_tritonserver_command(record, server[1:])
        expected = [f"--backend-config=python,shm-region-prefix-name=prefix{rank}_"]
        if rank > 0:
            expected += ["--model-control-mode=explicit", f"--load-model={tensorrt_llm_model}"]
        problems += [f"rank {rank}: missing {flag}" for flag in expected if flag not in server]
    return problems


def check_metric(record: ReleaseRecord, name: str, labels: Mapping[str, str] | None = None) -> list[str]:
    """A metric series the operator queries: the family must exist and each label value be exported."""
    base = re.sub(r"_(bucket|sum|count)$", "", name)
    family = record.metrics.get(name) or record.metrics.get(base)
    if family is None:
        return [f"metric {name} is not exported in {record.release}"]
    problems = []
    for label, value in (labels or {}).items():
        if label not in family.labels and label != "le":
            problems.append(f"metric {family.name} has no label {label!r}")
        elif family.labels.get(label) is not None and value not in family.labels[label]:
            problems.append(f"metric {family.name}{{{label}={value!r}}} is not exported in {record.release} "
                            f"(values: {', '.join(family.labels[label])})")
    return problems


def check_group_mpirun_command(record: ReleaseRecord, lws: LwsRecord, argv: list[str], tensorrt_llm_model: str,
                               gpus_per_pod: int) -> list[str]:
    """A rank group's `mpirun` over a LeaderWorkerSet group against upstream's recipe (the LWS
    record's rank_group): its flags, -np the world, --host every pod with its GPUs as slots,
    every rank but 0 serving nothing; the app contexts as `check_mpirun_command` checks them."""
    if not argv or argv[0] != "mpirun":
        return [f"not an mpirun command: {argv[:1]}"]
    first = argv.index("-n") if "-n" in argv else len(argv)
    options, contexts = argv[1:first], argv[first:]
    problems, values = [], {}
    i = 0
    while i < len(options):
        option = options[i]
        if option in ("-np", "--host"):
            values[option], i = options[i + 1] if i + 1 < len(options) else "", i + 2
        elif option == "-mca":
            if options[i + 1:i + 2] != [lws.rsh_agent_parameter]:
                problems.append(f"mpirun: -mca sets {options[i + 1:i + 2]}, the recipe sets only {lws.rsh_agent_parameter}")
            i += 3
        elif option in lws.mpirun_flags or option in record.mpirun_flags:
            i += 1
        else:
            problems.append(f"mpirun: unknown flag {option}")
            i += 1
    ranks = contexts.count(":") + 1
    if values.get("-np") != str(ranks):
        problems.append(f"mpirun: -np {values.get('-np')} but {ranks} ranks")
    slots = [host.rpartition(":")[2] for host in values.get("--host", "").split(",") if host]
    if not slots or any(slot != str(gpus_per_pod) for slot in slots) or len(slots) * gpus_per_pod != ranks:
        problems.append(f"mpirun: --host {values.get('--host')!r} does not give each pod its {gpus_per_pod} GPUs "
                        f"as slots for {ranks} ranks")
    problems += check_mpirun_command(record, ["mpirun", *contexts], tensorrt_llm_model)
    expected = [flag.replace("<tensorrt_llm model name>", tensorrt_llm_model) for flag in lws.other_rank_flags]
    for rank, context in enumerate(" ".join(contexts).split(" : ")[1:], start=1):
        problems += [f"rank {rank}: missing {flag}" for flag in expected if flag not in context.split(" ")]
    return problems
