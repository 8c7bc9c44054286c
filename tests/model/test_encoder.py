"""The encoder assembled from specs that no family uses: every layout gives the same outputs and gradients, and
each part equals its reference maths written out here (a sliding window as a masked dense attention, pre-LN,
rotary positions, a gated feed-forward, relative-position score terms)."""

import math

import pytest
import torch

from bertforge import BertforgeError
import torch.nn.functional as F

from bertforge import BertConfig
from bertforge.model.spec import RelativeBias
from bertforge.model import BertModel, EncoderSpec, LayerAttention, RelativeAttention, pack
from bertforge.model.parts import relative_positions

V, H, NH, I, L = 61, 32, 4, 48, 3
LENGTHS = [13, 13, 9, 4]  # non-increasing, as packing wants; longer than the window


def spec_modern(**kw) -> EncoderSpec:
    """Pre-LN, no norm before block 0's attention, rotary with two θ, a window of 4 in two of three blocks, a gated
    feed-forward, no biases, a final norm, no position table, no token types."""
    layers = tuple(LayerAttention(window=None if i % 3 == 0 else 4, rope_theta=160_000.0 if i % 3 == 0 else 10_000.0)
                   for i in range(L))
    base = dict(vocab_size=V, hidden_size=H, num_layers=L, num_heads=NH, intermediate_size=I, activation="gelu",
                max_positions=64, type_vocab_size=0, positions="none", norm="pre", first_attention_norm=False,
                final_norm=True, norm_bias=False, norm_eps=1e-5, ffn="gated", attention_bias=False, mlp_bias=False,
                layers=layers, pooler=False, init="scaled-truncated", hidden_dropout=0.0, attention_dropout=0.0)
    base.update(kw)
    return EncoderSpec(**base)


def spec_relative(share_key: bool = True, terms=("c2p", "p2c")) -> EncoderSpec:
    """Post-LN, no absolute positions, DeBERTa-style relative score terms from a normalised shared table."""
    return EncoderSpec(vocab_size=V, hidden_size=H, num_layers=2, num_heads=NH, intermediate_size=I, activation="gelu",
                       max_positions=64, positions="none", zero_padding_embeddings=True, norm_eps=1e-7,
                       relative=RelativeAttention(buckets=8, max_distance=16, terms=terms, share_key=share_key),
                       pooler=False, hidden_dropout=0.0, attention_dropout=0.0)


def build(spec: EncoderSpec, seed: int = 0) -> BertModel:
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=V, hidden_size=H, num_hidden_layers=spec.num_layers, num_attention_heads=NH,
                        intermediate_size=I, max_position_embeddings=64, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    model = BertModel(config, spec=spec)
    with torch.no_grad():  # norms away from 1 / 0, so a missing or misplaced one shows
        for name, p in model.named_parameters():
            if "LayerNorm" in name or "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model


def batch(side: str = "right"):
    g = torch.Generator().manual_seed(1)
    S = max(LENGTHS)
    ids = torch.zeros(len(LENGTHS), S, dtype=torch.long)
    mask = torch.zeros(len(LENGTHS), S, dtype=torch.long)
    for b, n in enumerate(LENGTHS):
        cols = slice(0, n) if side == "right" else slice(S - n, S)
        ids[b, cols] = torch.randint(1, V, (n,), generator=g)
        mask[b, cols] = 1
    return ids, mask


def real_rows(x: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    return [x[b][mask[b].bool()] for b in range(len(LENGTHS))]


def spec_bias() -> EncoderSpec:
    """MPNet's parts: post-LN, positions after the padding id, a relative-position bias table shared by every block
    (buckets short enough that the rows reach its log buckets)."""
    return EncoderSpec(vocab_size=V, hidden_size=H, num_layers=2, num_heads=NH, intermediate_size=I, activation="gelu",
                       max_positions=64, positions="after-padding", pad_token_id=0, type_vocab_size=0,
                       relative_bias=RelativeBias(buckets=8, max_distance=12, table=10), pooler=False,
                       hidden_dropout=0.0, attention_dropout=0.0)


SPECS = {"pre-LN rotary gated window": spec_modern, "post-LN relative terms": spec_relative,
         "RMSNorm, interleaved rotary": lambda: spec_modern(norm_kind="rmsnorm", rotary="interleaved"),
         "grouped-query attention": lambda: spec_modern(num_kv_heads=2, norm_kind="rmsnorm"),
         "relative bias after padding": spec_bias,
         "relative, separate position projections": lambda: spec_relative(share_key=False),
         "relative, c2p only": lambda: spec_relative(terms=("c2p",))}


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_padded_unpadded_and_packed_layouts_agree_forward_and_backward(name, train):
    """Each layout, padded on the right and on the left, gives every real token the same hidden state and every
    parameter the same gradient (positions and windows restart at every sequence; padding never leaks)."""
    model = build(SPECS[name]())
    model.train(train)
    weights = torch.randn(sum(LENGTHS), H, generator=torch.Generator().manual_seed(2))
    results = {}
    for layout in ("padded", "unpadded", "left-padded", "packed"):
        model.zero_grad()
        ids, mask = batch("left" if layout == "left-padded" else "right")
        if layout == "packed":
            seqs = [ids[b][mask[b].bool()].tolist() for b in range(len(LENGTHS))]
            out = model.forward_packed(pack(seqs))  # [T, H]
        else:
            hidden = model(ids, mask, unpad=layout == "unpadded").last_hidden_state
            out = torch.cat(real_rows(hidden, mask))
        (out * weights).sum().backward()
        results[layout] = (out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    ref_out, ref_grads = results["padded"]
    assert len(ref_grads) == len(list(model.parameters()))  # every parameter is used
    for layout, (out, grads) in results.items():
        assert torch.allclose(out, ref_out, atol=2e-5), (layout, (out - ref_out).abs().max())
        for n, g in grads.items():
            assert torch.allclose(g, ref_grads[n], atol=1e-4, rtol=1e-4), (layout, n, (g - ref_grads[n]).abs().max())


def test_a_sequence_alone_equals_it_in_a_batch():
    model = build(spec_modern()).eval()
    ids, mask = batch()
    with torch.no_grad():
        together = model(ids, mask).last_hidden_state
        for b, n in enumerate(LENGTHS):
            alone = model(ids[b : b + 1, :n]).last_hidden_state[0]
            assert torch.allclose(alone, together[b, :n], atol=2e-5)


# ---------------------------------------------------------------------------------------------------- references
def rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary positions as complex numbers: pairs (x_k, x_{k + hd/2}) rotated by p · θ^(-2k/hd)."""
    n, nh, S, hd = x.shape
    freqs = theta ** (-torch.arange(0, hd, 2).double() / hd)  # [hd/2]
    angles = torch.arange(S).double()[:, None] * freqs  # [S, hd/2]
    z = torch.complex(x[..., : hd // 2].double(), x[..., hd // 2 :].double()) * torch.polar(torch.ones_like(angles), angles)
    return torch.cat([z.real, z.imag], dim=-1).float()


def reference_modern(model: BertModel, ids: torch.Tensor) -> torch.Tensor:
    """spec_modern's encoder written out plainly for one unpadded sequence [1, S]: pre-LN blocks, dense attention
    with the window masked, rotary, GeGLU, final norm."""
    spec = model.spec
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    ln = lambda x, w: F.layer_norm(x, (H,), sd[w], None, 1e-5)  # noqa: E731
    x = ln(F.embedding(ids, sd["embeddings.word_embeddings.weight"]), "embeddings.LayerNorm.weight")
    S, hd = ids.shape[1], H // NH
    dist = (torch.arange(S)[:, None] - torch.arange(S)[None, :]).abs()
    for i in range(L):
        p = f"encoder.layer.{i}."
        h = x if i == 0 else ln(x, p + "attention.norm.weight")
        q, k, v = (F.linear(h, sd[p + f"attention.self.{n}.weight"]).view(1, S, NH, hd).transpose(1, 2)
                   for n in ("query", "key", "value"))
        q, k = rope(q, spec.layers[i].rope_theta), rope(k, spec.layers[i].rope_theta)
        scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
        if spec.layers[i].window is not None:
            scores = scores.masked_fill(dist > spec.layers[i].window // 2, float("-inf"))
        ctx = (scores.softmax(-1) @ v).transpose(1, 2).reshape(1, S, H)
        x = x + F.linear(ctx, sd[p + "attention.output.dense.weight"])
        a, g = F.linear(ln(x, p + "intermediate.norm.weight"), sd[p + "intermediate.dense.weight"]).chunk(2, dim=-1)
        x = x + F.linear(F.gelu(a) * g, sd[p + "output.dense.weight"])
    return ln(x, "encoder.final_norm.weight")


def test_pre_ln_rotary_window_gated_encoder_equals_its_reference():
    model = build(spec_modern()).eval()
    names = set(model.state_dict())
    assert "encoder.layer.0.attention.norm.weight" not in names and "encoder.layer.1.attention.norm.weight" in names
    assert not any(n.endswith(".bias") for n in names)  # no biases anywhere
    ids = torch.randint(1, V, (1, 13))
    with torch.no_grad():
        got = model(ids).last_hidden_state
    assert torch.allclose(got, reference_modern(model, ids), atol=1e-5)


def test_windowed_attention_equals_dense_attention_with_the_window_masked():
    """A window wider than the sequence is global attention; narrowing it changes only what it should."""
    ids = torch.randint(1, V, (1, 13))
    wide = build(spec_modern(layers=tuple(LayerAttention(window=64, rope_theta=10_000.0) for _ in range(L)))).eval()
    glob = build(spec_modern(layers=tuple(LayerAttention(rope_theta=10_000.0) for _ in range(L)))).eval()
    narrow = build(spec_modern()).eval()
    with torch.no_grad():
        assert torch.allclose(wide(ids).last_hidden_state, glob(ids).last_hidden_state, atol=1e-6)
        assert not torch.allclose(narrow(ids).last_hidden_state, reference_modern(glob, ids), atol=1e-3)


def reference_relative(model: BertModel, ids: torch.Tensor) -> torch.Tensor:
    """spec_relative's encoder written out for one unpadded sequence: c2p and p2c with loops over i, j."""
    rel = model.spec.relative
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    ln = lambda x, p: F.layer_norm(x, (H,), sd[p + ".weight"], sd[p + ".bias"], 1e-7)  # noqa: E731
    lin = lambda x, p: F.linear(x, sd[p + ".weight"], sd[p + ".bias"])  # noqa: E731
    emb = F.embedding(ids, sd["embeddings.word_embeddings.weight"]) + sd["embeddings.token_type_embeddings.weight"][0]
    x = ln(emb, "embeddings.LayerNorm")[0]  # [S, H]
    S, hd = ids.shape[1], H // NH
    table = ln(sd["encoder.rel_embeddings.weight"], "encoder.LayerNorm")  # [2·span, H]
    index = relative_positions(S, rel)
    for i in range(2):
        p = f"encoder.layer.{i}.attention."
        q, k, v = (lin(x, p + f"self.{n}").view(S, NH, hd) for n in ("query", "key", "value"))
        if "c2p" in rel.terms:
            kr = lin(table, p + ("self.key" if rel.share_key else "relative.pos_key_proj")).view(-1, NH, hd)
        if "p2c" in rel.terms:
            qr = lin(table, p + ("self.query" if rel.share_key else "relative.pos_query_proj")).view(-1, NH, hd)
        scores = torch.einsum("ihd,jhd->hij", q, k)
        for a in range(S):
            for b in range(S):
                if "c2p" in rel.terms:
                    scores[:, a, b] += (q[a] * kr[index[a, b]]).sum(-1)
                if "p2c" in rel.terms:
                    scores[:, a, b] += (k[b] * qr[index[a, b]]).sum(-1)
        probs = (scores / math.sqrt(hd * (1 + len(rel.terms)))).softmax(-1)
        ctx = torch.einsum("hij,jhd->ihd", probs, v).reshape(S, H)
        x = ln(x + lin(ctx, p + "output.dense"), p + "output.LayerNorm")
        p = f"encoder.layer.{i}."
        x = ln(x + lin(F.gelu(lin(x, p + "intermediate.dense")), p + "output.dense"), p + "output.LayerNorm")
    return x


@pytest.mark.parametrize("share_key", [True, False])
@pytest.mark.parametrize("terms", [("c2p", "p2c"), ("c2p",), ("p2c",)])
def test_relative_score_terms_equal_their_reference(share_key, terms):
    model = build(spec_relative(share_key, terms)).eval()
    ids = torch.randint(1, V, (1, 13))  # longer than the 8 buckets: log buckets in use
    with torch.no_grad():
        got = model(ids).last_hidden_state[0]
    assert torch.allclose(got, reference_relative(model, ids), atol=1e-5)


def test_relative_embeddings_zero_the_padding_and_an_eager_run_agrees():
    model = build(spec_relative()).eval()
    ids, mask = batch()
    with torch.no_grad():
        sdpa = model(ids, mask).last_hidden_state
        model.set_attn_implementation("eager")
        out = model(ids, mask, output_attentions=True)
    assert torch.allclose(out.last_hidden_state[mask.bool()], sdpa[mask.bool()], atol=1e-5)
    probs = out.attentions[0]  # [B, nh, S, S]
    assert probs[:, :, :, :][mask[:, None, None, :].expand_as(probs) == 0].abs().max() == 0  # padding keys get nothing


def test_long_sequences_attend_their_windows_in_blocks_with_the_same_result(monkeypatch):
    """Past `blockwise_min_length` a window is attended in blocks of queries (time and memory with L · window):
    the outputs and gradients equal the dense band-masked attention in every layout, padding on either side."""
    from bertforge.model import attention

    spec = spec_modern(layers=tuple(LayerAttention(window=8, rope_theta=10_000.0) for _ in range(2)), num_layers=2)
    model = build(spec)
    lengths = [150, 131, 20]  # two calls past 8 · 16 = 128 tokens, one below
    g = torch.Generator().manual_seed(3)
    seqs = [torch.randint(1, V, (n,), generator=g).tolist() for n in lengths]
    calls = []
    real_blocks = attention.attend_blocks
    monkeypatch.setattr(attention, "attend_blocks", lambda *a, **k: calls.append(a[0].shape[-2]) or real_blocks(*a, **k))

    def run(blockwise: bool, layout: str):
        monkeypatch.setattr(attention, "BLOCKWISE_MIN_WINDOWS", 8 if blockwise else 10**6)
        model.zero_grad()
        if layout == "packed":
            out = model.forward_packed(pack(seqs))
        else:
            S = max(lengths)
            ids = torch.zeros(len(seqs), S, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for b, s in enumerate(seqs):
                cols = slice(0, len(s)) if layout == "right" else slice(S - len(s), S)
                ids[b, cols], mask[b, cols] = torch.tensor(s), 1
            hidden = model(ids, mask, unpad=layout == "right").last_hidden_state
            out = torch.cat([hidden[b][mask[b].bool()] for b in range(len(seqs))])
        out.square().mean().backward()
        return out.detach(), [p.grad.clone() for p in model.parameters()]

    for layout in ("right", "left", "packed"):
        calls.clear()
        dense_out, dense_grads = run(False, layout)
        assert calls == []
        out, grads = run(True, layout)
        assert calls, layout  # the blocks really ran
        assert torch.allclose(out, dense_out, atol=2e-5), layout
        for a, b in zip(grads, dense_grads):
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), layout
    assert torch.allclose(run(True, "right")[0], run(True, "packed")[0], atol=2e-5)


def test_grouped_query_attention_equals_every_head_with_its_groups_key_and_value():
    """4 query heads sharing 2 key/value heads (each serving heads 2j and 2j + 1, as transformers' repeat_kv) compute
    what 4-head attention whose key/value projections repeat each shared head does; every layout agrees."""
    kv, hd = 2, H // NH
    gqa = build(spec_modern(num_kv_heads=kv, norm_kind="rmsnorm"))
    full = BertModel(gqa.config, spec=spec_modern(norm_kind="rmsnorm"))
    assert gqa.encoder.layer[0].attention.self.key.weight.shape == (kv * hd, H)
    state = gqa.state_dict()
    for key, tensor in list(state.items()):
        if ".attention.self.key." in key or ".attention.self.value." in key:  # [kv·hd, ...] → [nh·hd, ...]
            state[key] = tensor.view(kv, hd, *tensor.shape[1:]).repeat_interleave(NH // kv, dim=0).flatten(0, 1)
    full.load_state_dict(state)
    ids, mask = batch()
    gqa.eval(), full.eval()
    with torch.no_grad():
        ours, reference = gqa(ids, mask).last_hidden_state, full(ids, mask).last_hidden_state
        packed = gqa.forward_packed(pack([ids[b][mask[b].bool()].tolist() for b in range(len(LENGTHS))]))
    assert torch.allclose(torch.cat(real_rows(ours, mask)), torch.cat(real_rows(reference, mask)), atol=1e-5)
    assert torch.allclose(packed, torch.cat(real_rows(reference, mask)), atol=1e-5)
    with pytest.raises(BertforgeError, match="cannot share 3 key/value heads"):
        spec_modern(num_kv_heads=3)
