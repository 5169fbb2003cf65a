"""``opbench moe``: one MoE block (router, top-k, permutation, grouped expert GEMMs, shared experts, combine) timed
forward and backward, as a whole and by phase, under the routing distributions users see (docs/moe.md)."""
