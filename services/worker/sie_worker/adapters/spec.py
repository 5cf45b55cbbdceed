"""What an adapter family serves, declared once on its class (`spec`), checked when the class is defined, read by
the engine to plan requests and by the model check at load (a config may ask only for what its adapter serves).

    spec = AdapterSpec(
        "nli_zero_shot",
        tasks=("extract",),
        labels=True,
        options=(Option("hypothesis_template", "the hypothesis, `{}` where the label goes"),
                 Option("multi_label", "score each label on its own", check=boolean)),
    )

An option's `check` raises ValueError for a value out of its bounds; the message names the option. Checks that need
the loaded model (a task token the checkpoint knows, labels that fit its length) are the adapter's `check`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sie_common.cluster.model_config import INPUTS, OUTPUT_TYPES, TASKS, ModelConfig

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def probability(value: Any, where: str) -> float:
    """A number from 0 to 1 (a threshold); bools are not numbers here, though Python counts them as ints."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"{where}: must be a number from 0 to 1, got {value!r}")
    return float(value)


def whole_number(value: Any, where: str, low: int, high: int) -> int:
    """A whole number from `low` to `high` (JSON sends 3 as 3.0 through a Struct)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not low <= value <= high
        or value != int(value)
    ):
        raise ValueError(f"{where}: must be a whole number from {low} to {high}, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Option:
    """A request option (a key of `options`) an adapter reads, for the tasks it names (every task of the adapter by
    default); `check(value)` raises ValueError for a value out of its bounds."""

    name: str
    help: str
    check: Callable[[Any], object] | None = None
    tasks: tuple[str, ...] = ()


@dataclass(frozen=True)
class AdapterSpec:
    """What the adapter of this `name` (a profile's `adapter:`) serves."""

    name: str
    tasks: tuple[str, ...]
    inputs: tuple[str, ...] = ("text",)
    # What an encoder's forward pass computes (encode, and a score by embeddings).
    outputs: tuple[str, ...] = ()
    # The request's options it reads.
    options: tuple[Option, ...] = ()
    # Whether an extract request names the labels (zero-shot): it must then name at least one.
    labels: bool = False
    # An option that may stand in for the labels (the adapter's check says whether what it holds is enough).
    labels_or_option: str = ""
    # Whether it scores (query, item) pairs itself (a cross-encoder) rather than comparing embeddings.
    pairs: bool = False
    # Whether an item's text and image are read together, as one input (a multimodal LLM embedder or reranker: the
    # image, then the text, in one prompt), rather than each item holding one of them; its image items then read the
    # request's instruction too.
    text_with_image: bool = False

    def problems(self) -> list[str]:
        """What is wrong with the declaration itself."""
        found = []
        if not _NAME.match(self.name):
            found.append(f"name {self.name!r} is not lowercase letters, digits and '_'")
        for field, given, known in (
            ("tasks", self.tasks, TASKS),
            ("inputs", self.inputs, INPUTS),
            ("outputs", self.outputs, OUTPUT_TYPES),
        ):
            unknown = [value for value in given if value not in known]
            if unknown:
                found.append(f"{field} {unknown} are not among {', '.join(known)}")
        if not self.tasks or not self.inputs:
            found.append("it must serve at least one task and take at least one input")
        if "encode" in self.tasks and not self.outputs:
            found.append("an encoder must declare its outputs")
        if (self.outputs and not ({"encode", "score"} & set(self.tasks))) or (self.pairs and self.outputs):
            found.append("outputs are an encoder's: it encodes, or scores by comparing embeddings")
        if self.text_with_image and "image" not in self.inputs:
            found.append("text_with_image is for an adapter that takes images")
        if self.pairs and self.tasks != ("score",):
            found.append("a pair scorer does score only")
        if self.labels and "extract" not in self.tasks:
            found.append("labels are an extractor's")
        if self.labels_or_option and (not self.labels or self.labels_or_option not in self.option_names("extract")):
            found.append("labels_or_option must be an extract option of an adapter that reads labels")
        names = [option.name for option in self.options]
        if len(names) != len(set(names)):
            found.append(f"options {names} name one option twice")
        found += [
            f"option {option.name} is read for tasks it does not serve ({', '.join(option.tasks)})"
            for option in self.options
            if not set(option.tasks) <= set(self.tasks)
        ]
        return found

    def option_names(self, task: str) -> tuple[str, ...]:
        """The options a request of `task` may give."""
        return tuple(option.name for option in self.options if not option.tasks or task in option.tasks)

    def check_config(self, config: ModelConfig) -> None:
        """ValueError unless `config` asks only for tasks, inputs and output types this adapter serves."""
        missing_tasks = [task for task in config.tasks if task not in self.tasks]
        if missing_tasks:
            raise ValueError(
                f"tasks: adapter {self.name} does not do {', '.join(missing_tasks)}; it does: {', '.join(self.tasks)}"
            )
        if "image" in config.inputs and "image" not in self.inputs:
            raise ValueError(f"inputs: adapter {self.name} does not take images; it takes: text")
        if "encode" not in config.tasks:
            return
        produced = set(self.outputs) | ({"dense"} if "multivector" in self.outputs else set())
        missing = [output for output in config.output_types if output not in produced]
        if missing:
            raise ValueError(
                f"output_types: adapter {self.name} does not produce {', '.join(missing)}; "
                f"it produces: {', '.join(sorted(produced))}"
            )

    @property
    def uses_muvera(self) -> bool:
        """Whether its dense output is the MUVERA encoding of its multivectors (it has none of its own)."""
        return "multivector" in self.outputs and "dense" not in self.outputs
