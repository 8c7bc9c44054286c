"""`Vocabulary`: what a tokenizer's vocabulary holds — tokens and ids both ways, the special tokens by role, and
how the kind's template lays them around one segment or a pair. `Tokenizer` (`core.py`) builds on it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import Any, cast

import tokenizers
from tokenizers import AddedToken

from bertforge.core.errors import BertforgeError
from bertforge.tokenizer.kinds import TokenizerKind


def _role_token(role: str) -> property:
    return property(lambda self: self._special_tokens.get(role), doc=f"The {role.replace('_', ' ')} (None if the "
                                                                         f"kind has none).")


def _role_id(role: str) -> property:
    def get(self: Vocabulary) -> int | None:
        token = self._special_tokens.get(role)
        return None if token is None else self._backend.token_to_id(token)

    return property(get, doc=f"The id of {role} (None if the kind has none).")


class Vocabulary:
    """The tokens of a `tokenizers.Tokenizer` backend and its special tokens, by role, for a `TokenizerKind`."""

    def __init__(self, backend: tokenizers.Tokenizer, special_tokens: dict[str, str] | None, kind: TokenizerKind,
                 source: str) -> None:
        """Check that `backend`'s vocabulary holds every special token (role -> token: `special_tokens` over the
        kind's defaults) and register them as special added tokens (see `special_added_tokens`); `source`: what to
        name in error messages."""
        self._kind = kind
        self._special_tokens = {**kind.special_tokens, **(special_tokens or {})}
        for role, token in self._special_tokens.items():
            if backend.token_to_id(token) is None:
                raise BertforgeError(f"{source}: vocabulary lacks the required special token {token} ({role} of "
                                     f"{kind.a_tokenizer})")
        backend.add_special_tokens(special_added_tokens(backend, self._special_tokens, kind))
        self._backend = backend

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The `tokenizers.Tokenizer` doing the work."""
        return self._backend

    @property
    def vocab_size(self) -> int:
        """The number of tokens, special tokens included."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    def check_fits_model(self, vocab_size: int, source: str) -> None:
        """Refuse a tokenizer whose ids run past a model's vocabulary (`vocab_size` rows of word embeddings): they
        belong to different models. A larger model vocabulary (embeddings padded to a round number) is fine."""
        if self.vocab_size > vocab_size:
            raise BertforgeError(
                f"{source}: the tokenizer has {self.vocab_size:,} tokens but the model's vocab_size is {vocab_size:,}; "
                "ids past it have no embedding (are the tokenizer and the model from the same checkpoint?)"
            )

    def get_vocab(self) -> dict[str, int]:
        """Token -> id for every token, special tokens included."""
        return self._backend.get_vocab(with_added_tokens=True)

    def fingerprint(self) -> list[Any]:
        """[vocab_size, digest]: the size and a BLAKE2b digest of the token -> id table, what a checkpoint records of
        the vocabulary it was trained with (another table gives other ids to the same text)."""
        table = json.dumps(sorted(self.get_vocab().items(), key=lambda item: item[1]), ensure_ascii=False)
        return [self.vocab_size, hashlib.blake2b(table.encode("utf-8"), digest_size=16).hexdigest()]

    def convert_tokens_to_ids(self, tokens: str | Iterable[str]) -> int | list[int]:
        """The id of a token (or of each token); unknown tokens give the [UNK] id."""
        if isinstance(tokens, str):
            token_id = self._backend.token_to_id(tokens)
            return self.unk_token_id if token_id is None else token_id
        return [self.convert_tokens_to_ids(token) for token in tokens]  # type: ignore[misc]  # each an int

    def convert_ids_to_tokens(self, ids: int | Iterable[int], skip_special_tokens: bool = False) -> str | list[str]:
        """The token of an id (or of each id), optionally dropping special tokens from a list."""
        if isinstance(ids, int):
            return self._backend.id_to_token(ids)  # type: ignore[return-value]  # None only for an id beyond the vocabulary
        special_ids = set(self.all_special_ids) if skip_special_tokens else set()
        return [self._backend.id_to_token(int(i)) for i in ids if int(i) not in special_ids]  # type: ignore[misc]

    @property
    def kind(self) -> TokenizerKind:
        """The tokenizer family: special tokens, template, model and pipeline."""
        return self._kind

    @property
    def special_tokens(self) -> dict[str, str]:
        """Role ("pad_token", ...) -> token, as written to special_tokens_map.json."""
        return dict(self._special_tokens)

    @property
    def all_special_ids(self) -> list[int]:
        """The ids of the special tokens (each once)."""
        return list(dict.fromkeys(self._role_ids.values()))

    @property
    def _role_ids(self) -> dict[str, int]:
        """Role -> id of the special tokens (the kind's roles: RoBERTa's bos_token is its cls_token, ...)."""
        return {role: self._backend.token_to_id(token) for role, token in self._special_tokens.items()}  # type: ignore[misc]  # in the vocabulary (__init__ checks)

    pad_token, unk_token, cls_token, sep_token, mask_token, bos_token, eos_token = (
        _role_token(role) for role in ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token",
                                       "bos_token", "eos_token"))
    pad_token_id, unk_token_id, cls_token_id, sep_token_id, mask_token_id, bos_token_id, eos_token_id = (
        _role_id(role) for role in ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token",
                                    "bos_token", "eos_token"))

    def build_inputs(self, ids_a: Sequence[int], ids_b: Sequence[int] | None = None) -> tuple[list[int], list[int]]:
        """(input_ids, token_type_ids) of one segment of token ids, or of a pair, with this kind's special tokens
        laid out as its template says (what `__call__` adds): [CLS] A [SEP] B [SEP] with types 0 … 0 1 … 1 for
        BERT and ALBERT, <s> A </s></s> B </s> all of type 0 for RoBERTa and XLM-RoBERTa."""
        ids: list[int] = []
        types: list[int] = []
        for piece, type_id in self._kind.pieces(pair=ids_b is not None):
            run = ids_a if piece == "A" else cast("Sequence[int]", ids_b) if piece == "B" else [self._role_ids[piece]]
            ids += run
            types += [type_id] * len(run)
        return ids, types

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        """How many special tokens the template adds to one segment (or to a pair): 2 (3), or 2 (4) for RoBERTa."""
        return sum(not piece.is_segment for piece in self._kind.pieces(pair))

    def continuation_mask(self) -> list[bool]:
        """For each id, whether its token continues the word before it ("##ing" in WordPiece; a byte-level or
        Unigram token not starting with "Ġ" or "▁"), for whole-word masking; False for special tokens."""
        special = set(self.all_special_ids)
        return [i not in special and self._kind.is_continuation(self._backend.id_to_token(i))  # type: ignore[arg-type]
                for i in range(self.vocab_size)]


def special_added_tokens(backend: tokenizers.Tokenizer, special_tokens: dict[str, str],
                          kind: TokenizerKind) -> list[AddedToken]:
    """The special tokens as special, unnormalized added tokens: one the backend already has keeps its stripping
    of spaces (roberta-base's <mask> strips those before it), a new one strips them as `kind.lstrip` says."""
    existing = {token.content: token for token in backend.get_added_tokens_decoder().values()}
    lstrip = {special_tokens[role] for role in kind.lstrip if role in special_tokens}
    result = []
    for token in dict.fromkeys(special_tokens.values()):
        old = existing.get(token)
        flags = (dict(lstrip=old.lstrip, rstrip=old.rstrip, single_word=old.single_word) if old is not None
                 else dict(lstrip=token in lstrip))
        result.append(AddedToken(token, special=True, normalized=False, **flags))
    return result
