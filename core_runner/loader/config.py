"""The checkpoint's JSON: config.json (never running the checkpoint's own code),
generation_config.json (EOS ids) and the tokenizer."""
from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Callable

from core_runner.loader.config_checks import check_config_values
from core_runner.loader.files import CheckpointError, read_json

logger = logging.getLogger(__name__)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt")


def _architectures(cfg_file: Path, raw: dict[str, Any]) -> list[str]:
    archs = raw.get("architectures")
    example = "e.g. \"architectures\": [\"Qwen3ForCausalLM\"]"
    if isinstance(archs, str):
        raise CheckpointError(f"{cfg_file}: 'architectures' is the string {archs!r}; expected a list of model "
                              f"class names ({example})")
    if not archs:
        state = "missing" if "architectures" not in raw else f"empty ({archs!r})"
        raise CheckpointError(f"{cfg_file}: 'architectures' is {state}, so no plugin can be chosen; expected a "
                              f"list of model class names ({example})")
    if not isinstance(archs, list) or not all(isinstance(a, str) and a for a in archs):
        raise CheckpointError(f"{cfg_file}: 'architectures' is {archs!r}; expected a list of model class names "
                              f"({example})")
    return archs


def load_hf_config(path: str | Path, served: Callable[[str], object] | None = None) -> Any:
    """The checkpoint's config as a transformers config object (or a plain PretrainedConfig
    for a model_type transformers does not know). ``trust_remote_code`` is always off.

    A config.json with ``auto_map`` ships its own modelling code, which core-runner never
    runs: it is refused unless ``served(architecture)`` is truthy (a registered plugin
    implements the architecture, so the checkpoint's code is not needed and is ignored)."""
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(
            f"model={str(path)!r}: no config.json there (expected a Hugging Face checkpoint directory)"
        )
    raw = read_json(cfg_file, "the model's configuration (a JSON object)")
    archs = _architectures(cfg_file, raw)
    if "auto_map" in raw:
        if served is None or not served(archs[0]):
            raise CheckpointError(
                f"{cfg_file}: 'auto_map' ({sorted(raw['auto_map']) if isinstance(raw['auto_map'], dict) else '...'})"
                f" points at modelling code shipped with the checkpoint, which core-runner never runs "
                f"(trust_remote_code is off); no plugin implements {archs[0]!r}: register a plugin for it instead"
            )
        logger.info("%s: ignoring auto_map (checkpoint code is never run); a plugin implements %s", cfg_file, archs[0])
    check_config_values(raw, str(cfg_file))  # before transformers reads (or chokes on) the values
    from transformers import CONFIG_MAPPING, AutoConfig, PretrainedConfig

    try:
        return AutoConfig.from_pretrained(str(path), trust_remote_code=False)
    except (ValueError, KeyError) as e:
        if raw.get("model_type") in CONFIG_MAPPING:  # transformers knows the class and refused the values
            raise _refused(cfg_file, raw, e) from e
        # an unknown model_type (or one whose class is only in the checkpoint's code)
        logger.debug("AutoConfig could not read %s (%s): using a plain PretrainedConfig", cfg_file, e)
        return PretrainedConfig(**raw)
    except Exception as e:  # noqa: BLE001 - transformers' config validators raise their own types
        raise _refused(cfg_file, raw, e) from e


def _refused(cfg_file: Path, raw: dict[str, Any], err: BaseException) -> CheckpointError:
    """transformers' refusal of a config as one line naming the file, with the fields its
    message quotes that the file leaves out (transformers then used its defaults)."""
    text = " ".join(str(err).split())
    missing = [n for n in dict.fromkeys(re.findall(r"`(\w+)`", text)) if n not in raw]
    note = "".join(f"{n} is missing from the file (transformers used its default); " for n in missing)
    return CheckpointError(f"{cfg_file}: {note}transformers refused the config: {type(err).__name__}: {text}")


def architecture_of(hf_config: Any) -> str:
    archs = getattr(hf_config, "architectures", None) or []
    if isinstance(archs, str) or not archs:
        raise ValueError(f"config.json 'architectures' is {archs!r}: expected a non-empty list of model class names, "
                         "so that a plugin can be chosen")
    return archs[0]


def eos_ids(value: Any, where: str) -> tuple[int, ...] | None:
    """An ``eos_token_id`` value as a tuple of ids (None stays None); anything else is an
    error naming ``where`` it was read."""
    if value is None:
        return None
    items = value if isinstance(value, (list, tuple)) else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in items):
        raise CheckpointError(f"{where}: eos_token_id is {value!r}; expected a token id or a list of token ids")
    return tuple(items)


def load_tokenizer(path: str | Path) -> Any | None:
    """The directory's tokenizer, or None when it has no tokenizer files. Its JSON files
    are checked first so that a corrupt one is named; remote tokenizer code is never run."""
    p = Path(path)
    present = [p / f for f in _TOKENIZER_FILES if (p / f).is_file()]
    if not present:
        return None
    for file in present:
        if file.suffix == ".json":
            read_json(file, "a tokenizer file (a JSON object)")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(p), trust_remote_code=False)
    except Exception as e:  # tokenizers / transformers raise many types; the message says which file set
        raise CheckpointError(
            f"{p}: the tokenizer ({', '.join(f.name for f in present)}) could not be loaded: {type(e).__name__}: {e}"
        ) from e
