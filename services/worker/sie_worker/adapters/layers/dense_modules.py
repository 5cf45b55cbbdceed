"""sentence-transformers `Dense` modules: linear maps with an activation, applied to the pooled vector.

A module's folder holds `config.json` (in_features, out_features, bias,
activation_function, use_residual) and its weights (`model.safetensors`, else
`pytorch_model.bin`: `linear.weight`, `linear.bias`, `residual.weight`). The
embeddinggemma layout chains two after pooling; stella's names its folder
after the output width (`2_Dense_1024`).
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import TypeGuard

import torch

from sie_worker.adapters.layers.checkpoint_files import module_folder, read_json

# Activation functions by the name sentence-transformers saves (only torch.nn's, never code from the directory).
ACTIVATIONS: dict[str, type[torch.nn.Module]] = {
    "torch.nn.modules.linear.Identity": torch.nn.Identity,
    "torch.nn.modules.activation.Tanh": torch.nn.Tanh,
    "torch.nn.modules.activation.ReLU": torch.nn.ReLU,
    "torch.nn.modules.activation.GELU": torch.nn.GELU,
    "torch.nn.modules.activation.Sigmoid": torch.nn.Sigmoid,
    "torch.nn.modules.activation.SiLU": torch.nn.SiLU,
}
# What sentence-transformers uses when the config names none.
_DEFAULT_ACTIVATION = "torch.nn.modules.activation.Tanh"
_POOLED = "sentence_embedding"


class DenseModule(torch.nn.Module):
    """activation(linear(x)), plus x (or its projection) when the module has a residual connection."""

    def __init__(
        self, in_features: int, out_features: int, *, bias: bool, activation: torch.nn.Module, residual: bool
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.linear = torch.nn.Linear(in_features, out_features, bias=bias)
        self.activation = activation
        self.use_residual = residual
        if residual and in_features != out_features:
            self.residual = torch.nn.Linear(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.activation(self.linear(x))
        if self.use_residual:
            out = out + (self.residual(x) if hasattr(self, "residual") else x)
        return out


def load_dense(directory: Path, path: str, in_features: int, device: torch.device) -> DenseModule:
    """The Dense module saved in the model directory's folder `path` (as modules.json names it), taking the
    `in_features` what comes before it gives, in float32 on `device`; ValueError naming the folder when it is
    not one, or lies outside the model directory. Nothing is allocated before the weights are seen to fit the
    config: a config claiming huge widths costs no memory."""
    folder = module_folder(directory, path)
    config = read_json(folder / "config.json")
    if not config or not isinstance(config, dict):
        raise ValueError(f"{folder}: a Dense module needs config.json (a JSON object)")
    for key in ("module_input_name", "module_output_name"):
        if config.get(key, _POOLED) not in (_POOLED, None):
            raise ValueError(f"{folder}: Dense {key} {config[key]!r} is not supported (only the pooled {_POOLED!r})")
    name = config.get("activation_function") or _DEFAULT_ACTIVATION
    if not isinstance(name, str) or name not in ACTIVATIONS:
        raise ValueError(
            f"{folder}: Dense activation function {name!r} is not supported; supported: {', '.join(ACTIVATIONS)}"
        )
    given = [config.get("in_features"), config.get("out_features")]
    widths = [width for width in given if _is_positive_int(width)]
    if len(widths) != len(given):
        raise ValueError(
            f"{folder}: Dense config.json needs positive integer in_features and out_features, got {given}"
        )
    if widths[0] != in_features:
        raise ValueError(
            f"{folder}: a Dense module takes {widths[0]} features, but what comes before it gives {in_features}"
        )
    state = _read_weights(folder)
    with torch.device("meta"):  # shapes only: the loaded tensors are assigned, once they are seen to fit
        module = DenseModule(
            widths[0],
            widths[1],
            bias=bool(config.get("bias", True)),
            activation=ACTIVATIONS[name](),
            residual=bool(config.get("use_residual", False)),
        )
    try:
        module.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as error:
        raise ValueError(f"{folder}: Dense weights do not fit its config.json: {error}") from None
    return module.to(device=device, dtype=torch.float32).eval()


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The module's tensors; ValueError for a file that is truncated, not a weights file, or a pickle of anything but
    tensors."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    for name in ("model.safetensors", "pytorch_model.bin"):
        file = folder / name
        if not file.exists():
            continue
        try:
            state = (
                load_file(str(file))
                if name == "model.safetensors"
                else torch.load(file, map_location="cpu", weights_only=True)
            )
        except (SafetensorError, RuntimeError, EOFError, OSError, pickle.UnpicklingError) as error:
            raise ValueError(f"{file}: the Dense weights cannot be read: {error}") from None
        if not isinstance(state, dict) or not all(isinstance(tensor, torch.Tensor) for tensor in state.values()):
            raise ValueError(f"{file}: the Dense weights are not a mapping of names to tensors")
        return state
    raise ValueError(f"{folder}: Dense module has no model.safetensors or pytorch_model.bin")


def _is_positive_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
