"""What SPLU-Gen's large-sum utility covers, in words, for every place that states it (plan,
report, release.json, ``privrelease estimate`` and ``calibrate splu``); a module of its own, so
that checking a policy loads no numerical library (:mod:`.splu_guarantees` has the math)."""

UTILITY_SCOPE = "the count of one sensitive value on its own, over all rows (its published count)"
"""What large-sum utility covers (Lemma 1: "for each sensitive value")."""

NO_UTILITY = (
    "Counts that also condition on non-sensitive columns or on other sensitive values are "
    "reconstructed and have no large-sum utility guarantee: they can be far off even when large."
)
"""What large-sum utility does not cover."""
