"""The decision rules of claims 2-4, fixed in analyses/PROTOCOL.md (reproduction grid, version
3, "Changes after the runs started"), applied to the per-seed files the analysis scripts write
(`position_probes.csv`, `distance_dependence.csv`, `attention_similarity_cross_seeds.csv`).

Each rule takes one split's file and returns (verdict, evidence). "A above B" means A's lowest
seed is above B's highest (for JSD, "closer": A's highest below B's lowest), the seed-range form
of claim 1's rule that one interval lies wholly above another.
"""

from __future__ import annotations

import pandas as pd

from nopeinterp.paper import FIVE_PES

TESTS = ("ID", "OOD")
NOT_EVALUATED = "not evaluated"  # a rule whose inputs lack a PE it compares
EXPLICIT_PES = tuple(p for p in FIVE_PES if p != "nope")


def _above(a: pd.Series, b: pd.Series) -> bool:
    """The protocol's seed-range rule: A is above B if A's lowest seed is above B's highest."""
    return bool(a.min() > b.max())


def _span(values: pd.Series) -> str:
    """One value, or [min, max] over seeds."""
    lo, hi = values.min(), values.max()
    return f"{lo:.3f}" if lo == hi else f"[{lo:.3f}, {hi:.3f}]"


def theorem1_verdict(probes: pd.DataFrame) -> tuple[str, str]:
    """Claim 2 on one split from the per-seed probes (`position_probes.csv`): NoPE's probe of
    absolute position after the first block (R^2), trained against random init. "supported"
    if every trained seed is above every random-init seed on ID and on OOD, "supported in
    distribution only" if on ID only, else "not supported". Returns (verdict, evidence)."""
    rows = probes[(probes["pe"] == "nope") & (probes["layer"] == 1) & (probes["metric"] == "r2")]
    above, evidence = {}, []
    for test in TESTS:
        t = rows[rows["split"] == test]
        trained = t.loc[t["model"] == "trained", "value"]
        init = t.loc[t["model"] == "random_init", "value"]
        if trained.empty or init.empty:
            return (
                NOT_EVALUATED,
                f"no NoPE {test} probe after the first block, trained and at random init",
            )
        above[test] = _above(trained, init)
        evidence.append(f"{test} R² {_span(trained)} (random init {_span(init)})")
    verdict = (
        "supported"
        if all(above.values())
        else "supported in distribution only"
        if above["ID"]
        else "not supported"
    )
    return verdict, "; ".join(evidence)


def later_layer_scores(distance: pd.DataFrame) -> pd.Series:
    """Per (pe, split, seed): the distance-dependence score of blocks 2 on (layers >= 1), the
    mean over those blocks of the mean over heads (from `distance_dependence.csv`)."""
    later = distance[distance["layer"] >= 1]
    return later.groupby(["pe", "split", "seed"])["mean"].mean()


def theorem2_verdict(distance: pd.DataFrame) -> tuple[str, str]:
    """Claim 3 on one split from the per-seed distance dependence: "shown" if on ID and on OOD
    NoPE is above the sinusoidal APE (the absolute PE, the control) and T5 is not above NoPE;
    "not shown" if NoPE is above the sinusoidal APE on neither; else "partly". Each test's
    evidence names the PEs NoPE is above, below and not separated from."""
    scores = later_layer_scores(distance)
    pes = set(scores.index.get_level_values("pe"))
    if not {"nope", "t5", "sinusoidal"} <= pes:
        return NOT_EVALUATED, "the rule needs NoPE, T5 and sinusoidal APE runs"
    held, over_control, evidence = {}, {}, []
    for test in TESTS:
        nope = scores.loc[("nope", test)]
        others = [p for p in EXPLICIT_PES if p in pes]
        above = [p for p in others if _above(nope, scores.loc[(p, test)])]
        below = [p for p in others if _above(scores.loc[(p, test)], nope)]
        level = [p for p in others if p not in above and p not in below]
        over_control[test] = "sinusoidal" in above
        held[test] = over_control[test] and "t5" not in below
        parts = [f"above {', '.join(above)}" if above else "", f"below {', '.join(below)}" if below else "",
                 f"not separated from {', '.join(level)}" if level else ""]  # fmt: skip
        evidence.append(f"{test} NoPE {_span(nope)}: " + "; ".join(p for p in parts if p))
    if all(held.values()):
        verdict = "shown"
    elif not any(over_control.values()):
        verdict = "not shown"
    else:
        verdict = "partly"
    return verdict, " | ".join(evidence)


def claim4_verdict(rankings: pd.DataFrame) -> tuple[str, str]:
    """Claim 4 on one split from the cross-seed rankings (`attention_similarity_cross_seeds.csv`:
    NoPE seed s against each PE's seed s+1): "supported" if T5 has the lowest JSD of the
    explicit PEs in every (test, seed) ranking, "partly" if in at least half, else "not
    supported". Beside it: T5 against NoPE-prime by the seed-range rule."""
    explicit = rankings[rankings["ref"].isin(EXPLICIT_PES)]
    if "t5" not in set(explicit["ref"]):
        return NOT_EVALUATED, "the rule needs T5 in the cross-seed rankings"
    firsts = explicit.loc[explicit.groupby(["split", "seed"], sort=False)["mean"].idxmin(), "ref"]
    n, k = len(firsts), int((firsts == "t5").sum())
    verdict = "supported" if k == n else "partly" if 2 * k >= n else "not supported"
    evidence = [f"T5 the closest explicit PE in {k} of {n} cross-seed rankings"]
    for test in TESTS:
        t = rankings[rankings["split"] == test]
        t5 = t.loc[t["ref"] == "t5", "mean"]
        prime = t.loc[t["ref"] == "nope_prime", "mean"]
        if t5.empty or prime.empty:
            continue
        relation = (
            "closer than NoPE-prime"
            if _above(-t5, -prime)
            else "further than NoPE-prime"
            if _above(t5, prime)
            else "not separated from NoPE-prime"
        )
        evidence.append(f"{test}: T5 {_span(t5)}, {relation} ({_span(prime)})")
    return verdict, "; ".join(evidence)
