"""The prefix hit a hybrid (KDA + MLA) engine should give a conversation's next turn; pure arithmetic."""
from __future__ import annotations

# The assistant-turn opener K3's chat template appends after the last message (`<|im_assistant|>assistant
# <|im_middle|>`: 3 tokens); the turn's KDA checkpoint sits before it, so the shared part excludes it.
TURN_OPENER_TOKENS = 3


def predicted_hit_tokens(previous_prompt_tokens: int, block_tokens: int) -> int:
    """Cached tokens expected on the turn after a prompt of previous_prompt_tokens: the last hash-block boundary
    inside the previous turn's messages (a hit lands only where a KDA checkpoint is kept: turn ends, rounded
    down to a block; K3's documented design)."""
    shared = max(previous_prompt_tokens - TURN_OPENER_TOKENS, 0)
    return shared // block_tokens * block_tokens
