"""Model adapters by the name model profiles use in `adapter:`."""

from __future__ import annotations

from collections.abc import Callable

from sie_worker.adapters.base import LoadContext, ModelAdapter
from sie_worker.adapters.families.bge_m3 import BgeM3Encoder
from sie_worker.adapters.families.clip import DualEncoder
from sie_worker.adapters.families.colbert import ColbertEncoder
from sie_worker.adapters.families.colpali import PageRetriever
from sie_worker.adapters.families.cross_encoder import CrossEncoderScorer
from sie_worker.adapters.families.detector import ZeroShotDetector
from sie_worker.adapters.families.document_reader import DocumentReader
from sie_worker.adapters.families.gliclass import GliclassClassifier
from sie_worker.adapters.families.gliner import GlinerExtractor
from sie_worker.adapters.families.glirel import GlirelExtractor
from sie_worker.adapters.families.llm_reranker import LlmReranker
from sie_worker.adapters.families.nli import NliZeroShotClassifier
from sie_worker.adapters.families.sentence_transformer import SentenceTransformerEncoder
from sie_worker.adapters.families.splade import SpladeEncoder
from sie_worker.adapters.families.token_classifier import TokenClassificationExtractor

ADAPTERS: dict[str, Callable[[LoadContext], ModelAdapter]] = {
    "sentence_transformer": SentenceTransformerEncoder,
    "splade": SpladeEncoder,
    "colbert": ColbertEncoder,
    "cross_encoder": CrossEncoderScorer,
    "llm_reranker": LlmReranker,
    "token_classifier": TokenClassificationExtractor,
    "gliner": GlinerExtractor,
    "glirel": GlirelExtractor,
    "clip": DualEncoder,
    "colpali": PageRetriever,
    "bge_m3": BgeM3Encoder,
    "zero_shot_detector": ZeroShotDetector,
    "nli_zero_shot": NliZeroShotClassifier,
    "gliclass": GliclassClassifier,
    "document_reader": DocumentReader,
}
