"""Checkpoints whose config names a model type of their own code (`auto_map`) over weights a transformers class
reads as they are: served by that class, so no code shipped with the weights runs.

| model type | shipped by | served as |
| --- | --- | --- |
| `llama_bidirec` | nvidia/llama-embed-nemotron-8b (`LlamaBidirectionalModel`) | `LlamaModel`, bidirectional |
| `bidir_mistral` | NV-Embed's decoder (`BidirectionalMistralModel`, in `text_config`) | `MistralModel`, bidirectional |

Their code subclasses the transformers model only to take the causal mask away, which the worker's own switch
does (sie_worker.kernels.bidirectional, checked at load by a probe); their extra config keys (`pooling`,
`temperature`) are what the sentence-transformers files beside them say again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import CONFIG_MAPPING, MODEL_MAPPING, PretrainedConfig, PreTrainedModel


@dataclass(frozen=True)
class NativeLoader:
    """Stands in for `AutoModel` (its `from_pretrained`) for one checkpoint: the native class with the config
    given, weight names renamed by `key_mapping` (regular expression -> replacement). Weights the class expects
    and the checkpoint lacks fail the load (ValueError), rather than being left at random values."""

    config: PretrainedConfig
    key_mapping: dict[str, str] | None = None

    def from_pretrained(self, directory: Path, *, trust_remote_code: bool = False, **kwargs: Any) -> PreTrainedModel:
        """The model of `directory`; `kwargs` go to the class's from_pretrained. Never runs the directory's code
        (`trust_remote_code` is the caller's, and not needed here)."""
        model_class: Any = MODEL_MAPPING[type(self.config)]
        model, info = model_class.from_pretrained(
            directory, config=self.config, key_mapping=self.key_mapping, output_loading_info=True, **kwargs
        )
        if info["missing_keys"]:
            missing = sorted(info["missing_keys"])
            raise ValueError(
                f"{directory}: the checkpoint lacks {len(missing)} weights of {model_class.__name__}, e.g. {missing[0]}"
            )
        return model


@dataclass(frozen=True)
class NativeArchitecture:
    """What a shipped model type is natively: transformers' model type, and whether its code attends both ways."""

    model_type: str
    bidirectional: bool

    def loader(self, raw: dict[str, Any], key_mapping: dict[str, str] | None = None) -> NativeLoader:
        """The native class over the checkpoint's config `raw` (its own type and code left out)."""
        settings = {key: value for key, value in raw.items() if key not in ("model_type", "auto_map", "architectures")}
        return NativeLoader(CONFIG_MAPPING[self.model_type](**settings), key_mapping)


NATIVE_ARCHITECTURES = {
    "llama_bidirec": NativeArchitecture("llama", bidirectional=True),
    "bidir_mistral": NativeArchitecture("mistral", bidirectional=True),
}


def native_architecture(model_type: object) -> NativeArchitecture | None:
    """The native stand-in for a shipped model type, None for any other (transformers' own types included)."""
    return NATIVE_ARCHITECTURES.get(model_type) if isinstance(model_type, str) else None
