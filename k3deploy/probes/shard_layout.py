"""The tensors a checkpoint's config implies, stdlib only: one tensor's verdict, and a whole header's in bulk
(shipped with the shard probe)."""
from __future__ import annotations

import math
from typing import Any

DTYPE_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "F4": 4, "I16": 16,
              "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64}
SCALE_DTYPES = ("U8", "F8_E8M0")  # MXFP4 scales: E8M0 exponents, stored as either
EXPERTS = ".block_sparse_moe.experts."


class Layout:
    """The dtypes and shapes config.json implies: MXFP4 packed/scale pairs for routed experts, BF16 elsewhere."""

    def __init__(self, config: dict[str, Any]) -> None:
        t = config.get("text_config") or config
        self.layers, hidden, vocab = int(t["num_hidden_layers"]), int(t["hidden_size"]), int(t["vocab_size"])
        self.expert_shapes: dict[str, list[int]] = {}
        # "<expert>.<kind>" -> (dtypes, shape, bytes) of every sound routed-expert tensor: one lookup for all.
        self.tails: dict[str, tuple[frozenset[str], list[int], int]] = {}
        if "text_config" not in config:  # not K3's layout (a flat config: Llama, DeepSeek): BF16 tensors only
            self.experts, self.first_moe = 0, 0
            self.exact = {n: [vocab, hidden] for n in ("model.embed_tokens.weight", "lm_head.weight")}
            self.moe_layers = frozenset[str]()
            return
        group = int((config.get("quantization_config") or {}).get("group_size", 32))
        inter, latent = int(t["moe_intermediate_size"]), int(t["routed_expert_hidden_size"])
        self.experts, self.first_moe = int(t["num_experts"]), int(t.get("first_k_dense_replace", 0))
        # w1 = gate, w3 = up: latent -> inter; w2 = down: inter -> latent. Two E2M1 per byte, one scale per group.
        dims = {"w1": (inter, latent), "w2": (latent, inter), "w3": (inter, latent)}
        for w, (rows, cols) in dims.items():
            self.expert_shapes[f"{w}.weight_packed"] = [rows, cols // 2]
            self.expert_shapes[f"{w}.weight_scale"] = [rows, cols // group]
        self.exact = {n: [vocab, hidden] for n in ("language_model.model.embed_tokens.weight",
                                                    "language_model.lm_head.weight")}
        self.moe_layers = frozenset(str(layer) for layer in range(self.first_moe, self.layers))
        for kind, want in self.expert_shapes.items():
            dtypes = frozenset(("U8",) if kind.endswith("packed") else SCALE_DTYPES)
            nbytes = math.prod(want)  # both scale dtypes are 8 bits, as U8 is
            self.tails.update((f"{e}.{kind}", (dtypes, want, nbytes)) for e in range(self.experts))

    @property
    def expert_count(self) -> int:
        """Routed-expert tensors a complete checkpoint has."""
        return (self.layers - self.first_moe) * self.experts * len(self.expert_shapes)

    def check(self, name: str, dtype: str, shape: list[int]) -> str | None:
        """None when the tensor is what the config implies, else what is wrong."""
        head, sep, tail = name.partition(EXPERTS)
        if not sep:
            if dtype != "BF16" and not name.startswith("vision"):
                return f"dtype {dtype}, expected BF16"
            want = self.exact.get(name)
            return f"shape {shape}, expected {want}" if want is not None and shape != want else None
        sound = self.tails.get(tail)
        if sound is not None and head.rpartition(".")[2] in self.moe_layers and dtype in sound[0] \
                and shape == sound[1]:
            return None
        expert, _, kind = tail.partition(".")
        layer = head.rpartition(".")[2]
        if not (expert.isdigit() and int(expert) < self.experts and layer.isdigit()
                and self.first_moe <= int(layer) < self.layers and kind in self.expert_shapes):
            return "not a routed-expert tensor of this config"
        if kind.endswith("packed") and dtype != "U8":
            return f"dtype {dtype}, expected U8 (two E2M1 values per byte)"
        if not kind.endswith("packed") and dtype not in SCALE_DTYPES:
            return f"dtype {dtype}, expected U8 or F8_E8M0 (E8M0 scales)"
        want = self.expert_shapes[kind]
        return f"shape {shape}, expected {want}" if shape != want else None

    def sound_experts(self, header: dict[str, Any], data_bytes: int) -> int | None:
        """The routed-expert tensor count when every tensor of the header (without __metadata__) is well formed
        and what the config implies, and in header order they tile the data_bytes after the header; else None,
        and the per-tensor check says what is wrong. Accepts nothing that check would refuse."""
        tails, exact, count, cursor, last_head = self.tails, self.exact, 0, 0, None
        try:
            for tensor, info in header.items():
                dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
                # Writers put tensors in data order (safetensors does): so the span check needs no sort.
                if begin != cursor:
                    return None
                cursor = end
                head, sep, tail = tensor.partition(EXPERTS)
                want = tails.get(tail)
                if want is not None:
                    if dtype not in want[0] or shape != want[1] or end - begin != want[2]:
                        return None
                    if head != last_head:  # a shard holds a layer or two: the check once per run of one head
                        if head.rpartition(".")[2] not in self.moe_layers:
                            return None
                        last_head = head
                    count += 1
                    continue
                if sep or dtype != "BF16" and not tensor.startswith("vision"):
                    return None
                nbytes = math.prod(shape) * DTYPE_BITS[dtype] // 8
                if end - begin != nbytes or nbytes < 0 or tensor in exact and shape != exact[tensor]:
                    return None
        except (KeyError, TypeError, ValueError):  # malformed: the per-tensor check names the entry
            return None
        return count if cursor == data_bytes else None
