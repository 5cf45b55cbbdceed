"""BERT-family encoders on real tokens (sie_worker.kernels.unpadded) given a batch with no padding at all, as a lone
query is: every position, the pooled output and a head's logits are transformers' own, and each row is what it is
beside a longer item that pads it; and the pooler layer the sentence_transformer adapter drops (only where the
model's forward skips it)."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification, BertModel

from sie_worker.adapters.families.sentence_transformer import pooler_skippable
from sie_worker.kernels.onednn import onednn_available, use_onednn
from sie_worker.kernels.unpadded import use_unpadded
from test_unpadded import CONFIG, built


def full(ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Inputs whose every position is a real token."""
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}


IDS = torch.randint(3, CONFIG.vocab_size, (3, 7), generator=torch.Generator().manual_seed(1))


@pytest.fixture(params=[False, True], ids=["plain", "onednn"])
def unpadded_bert(request: pytest.FixtureRequest) -> torch.nn.Module:
    """CONFIG's BertModel on real tokens only, its Linear layers packed for oneDNN or not."""
    model = built(BertModel, CONFIG)
    if request.param:
        if not onednn_available():
            pytest.skip("this PyTorch build has no oneDNN")
        use_onednn(model)
    assert use_unpadded(model)
    return model


@pytest.mark.parametrize("rows", [1, 3], ids=["one item", "items of one length"])
def test_a_batch_without_padding_matches_transformers(unpadded_bert: torch.nn.Module, rows: int) -> None:
    reference, model = built(BertModel, CONFIG), unpadded_bert
    with torch.inference_mode():
        got, expected = model(**full(IDS[:rows])), reference(**full(IDS[:rows]))
    assert got.last_hidden_state.shape == (rows, 7, CONFIG.hidden_size)
    torch.testing.assert_close(got.last_hidden_state, expected.last_hidden_state, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.pooler_output, expected.pooler_output, atol=1e-5, rtol=1e-5)


def test_an_item_alone_is_what_it_is_beside_a_longer_one() -> None:
    model = built(BertModel, CONFIG)
    assert use_unpadded(model)
    longer = torch.randint(3, CONFIG.vocab_size, (1, 9), generator=torch.Generator().manual_seed(2))
    padded = torch.ones(2, 9, dtype=torch.long)
    padded[0, :7], padded[1] = IDS[0], longer[0]
    mask = torch.zeros_like(padded)
    mask[0, :7], mask[1] = 1, 1
    with torch.inference_mode():
        alone = model(**full(IDS[:1])).last_hidden_state
        beside = model(input_ids=padded, attention_mask=mask, token_type_ids=torch.zeros_like(padded)).last_hidden_state
    torch.testing.assert_close(alone[0], beside[0, :7], atol=1e-5, rtol=1e-5)
    assert beside[0, 7:].abs().max() == 0


def test_a_classification_head_scores_an_unpadded_pair_as_transformers() -> None:
    config = BertConfig(**{**CONFIG.to_dict(), "num_labels": 1})
    reference, head = built(BertForSequenceClassification, config), built(BertForSequenceClassification, config)
    assert use_unpadded(head)
    with torch.inference_mode():
        torch.testing.assert_close(head(**full(IDS)).logits, reference(**full(IDS)).logits, atol=1e-5, rtol=1e-5)


def test_only_transformers_own_encoders_lose_their_pooler() -> None:
    """sentence_transformer drops a pooler nobody reads only where the model's forward skips one set to None."""

    class RemoteCode(BertModel):
        """A class of a model's own code (as trust_remote_code loads), which may call its pooler regardless."""

    bert = built(BertModel, CONFIG)
    assert pooler_skippable(bert)
    assert not pooler_skippable(RemoteCode(CONFIG))
    assert not pooler_skippable(BertModel(CONFIG, add_pooling_layer=False))
    bert.register_module("pooler", None)
    with torch.inference_mode():
        assert bert(**full(IDS)).pooler_output is None
