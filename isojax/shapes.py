"""The shape legend: what each letter of an array name's suffix means, declared once.

An array that crosses a function boundary carries its shape in its name, one letter per
axis after the last underscore (`logits_BTV` is [B, T, V]; a digit is that size:
`u_B1` is [B, 1]), or in a comment in the same letters. Every letter means one thing
throughout the code, so a reader who knows the legend reads any shape anywhere:
`tests/test_shapes.py` fails on a name whose suffix uses a letter outside `LEGEND`, or
an axis together with the axes it is made of (`COMPOSITE`). docs/shapes.md gives the
same table. Sizes in lowercase take the same letters (`b, t = tokens_BT.shape`).
"""

from __future__ import annotations

LEGEND: dict[str, str] = {
    # Rollouts and tokens.
    "B": "batch: one row per rollout or sequence of a call or a step",
    "G": "groups: problems, one group of rollouts each (of a batch, an evaluation, a "
         "dataset)",
    "N": "rollouts sampled per group",
    "M": "rollouts per group that are trained on (M <= N)",
    "P": "prompt tokens",
    "T": "response tokens (the positions a sampler call generates)",
    "S": "sequence: prompt and response positions of a forward pass (P + T)",
    "V": "vocabulary",
    # The model.
    "L": "layers",
    "D": "width (the model dimension, `embed_dim`)",
    "K": "kv heads",
    "R": "query heads per kv head",
    "Q": "query heads (K * R)",
    "H": "head dim",
    "F": "rotary frequencies (H / 2)",
    "I": "input features of a projection",
    "Y": "rows: leading axes flattened into one (the B * S token rows of a projection)",
    # Pieces of an axis.
    "C": "chunk length: positions of a sequence chunk, entries of a vocabulary block",
    "J": "chunks: how many chunks or blocks an axis is cut into (T / C, V / C)",
    # Devices and decode slots.
    "X": "data-parallel shards (the devices along the `batch` axes)",
    "U": "rollouts per shard (B / X)",
    "W": "decode slots per shard (continuous batching)",
    # The planner and searches.
    "A": "candidates a search compares (fitted curves, initial guesses, subsets, prompts)",
    "E": "points on a compute axis: a run's evaluations, or a grid of compute values",
    "Z": "bootstrap resamples",
}

# Axes made of others: a name holds the axis or its parts, never both (B is G x N
# flattened when sampling and G x M when training, Q is K x R, S is P then T).
COMPOSITE: dict[str, str] = {"B": "GNM", "Q": "KR", "S": "PT"}
