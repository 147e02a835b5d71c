"""Tabular Q-learning against value iteration's Q*, and a single update checked by hand."""

import pytest
import torch

import minirl.tabular as tab

MDPS = {
    "chain": lambda: tab.chain(n=5, gamma=0.9, slip=0.1),
    "gridworld": lambda: tab.gridworld(rows=3, cols=4, gamma=0.9, slip=0.2),
}


def non_terminal(mdp: tab.MDP) -> torch.Tensor:
    return torch.ones(mdp.n_states, dtype=torch.bool) if mdp.terminal is None else ~mdp.terminal


def test_first_update_is_the_reward_by_hand():
    # deterministic chain: the first update has alpha_1 = 1 and a next-state value of 0, so Q(s, a) = r(s, a)
    mdp = tab.chain(n=3, gamma=0.9, slip=0.0)
    result = tab.q_learning(mdp, steps=1, epsilon=1.0, seed=3)
    (s, a), = result.visits.nonzero().tolist()
    expected = torch.zeros_like(mdp.R)
    expected[s, a] = mdp.R[s, a]
    assert result.visits.sum() == 1
    torch.testing.assert_close(result.Q, expected)


def test_second_visit_averages_by_hand():
    # a one-state bandit with gamma = 0: Q(a) is the running average of r(a), which is constant, so it stays r(a);
    # with lr_power = 1, alpha_n = 1/n, and the Q of an arm is exact after its first pull
    rewards = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    mdp = tab.bandit(rewards, gamma=0.0)
    result = tab.q_learning(mdp, steps=200, epsilon=1.0, lr_power=1.0, seed=0)
    assert (result.visits > 0).all()
    torch.testing.assert_close(result.Q[0], rewards)


def test_same_seed_same_table_and_snapshots():
    mdp = MDPS["gridworld"]()
    a = tab.q_learning(mdp, steps=3000, seed=5, snapshot_every=1000)
    b = tab.q_learning(mdp, steps=3000, seed=5, snapshot_every=1000)
    c = tab.q_learning(mdp, steps=3000, seed=6)
    assert torch.equal(a.Q, b.Q) and not torch.equal(a.Q, c.Q)
    assert a.snapshots.shape == (3, mdp.n_states, mdp.n_actions)
    assert a.snapshot_steps.tolist() == [1000, 2000, 3000]
    assert torch.equal(a.snapshots[-1], a.Q)
    assert (a.Q[mdp.terminal] == 0).all()  # terminal states are never updated: their value is 0, as in Q*


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(steps=0), "steps"),
        (dict(epsilon=1.5), "epsilon"),
        (dict(lr_power=0.5), "lr_power"),
        (dict(horizon=0), "horizon"),
        (dict(snapshot_every=-1), "snapshot_every"),
    ],
)
def test_bad_arguments_name_the_problem(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tab.q_learning(MDPS["chain"](), **kwargs)


# --- learning test and its sabotaged twin ---


def q_learning_error(name: str) -> tuple[float, float]:
    """Relative max error of Q-learning's table against Q* (non-terminal states), and the relative value loss of
    acting greedily on it: max_s V*(s) - V^greedy(Q)(s). (Greedy actions need not agree exactly: in the gridworld two
    actions of one state are 0.003 apart in Q*.)

    Budget: 200k sampled transitions, uniformly random behaviour (epsilon = 1: Q-learning is off-policy),
    alpha_n = n^-0.7; about 1-2 s on one core.
    """
    mdp = MDPS[name]()
    Q_star, V_star = tab.value_iteration(mdp)
    Q = tab.q_learning(mdp, steps=200_000, epsilon=1.0, lr_power=0.7, seed=0).Q
    keep, scale = non_terminal(mdp), Q_star.abs().max()
    rel_err = ((Q - Q_star)[keep].abs().max() / scale).item()
    rel_loss = ((V_star - tab.state_values(mdp, tab.greedy_policy(Q))).max() / scale).item()
    return rel_err, rel_loss


@pytest.mark.learning
@pytest.mark.parametrize("name", MDPS)
def test_q_learning_matches_value_iteration(name):
    rel_err, rel_loss = q_learning_error(name)
    assert rel_err < 0.03  # measured: 0.3-0.5% on the chain, 1.3-2.2% on the gridworld over seeds 0-2
    assert rel_loss < 0.01  # acting greedily on the learnt table is (near) optimal


@pytest.mark.slow
@pytest.mark.parametrize("name", MDPS)
def test_sabotaged_q_learning_misses(name, monkeypatch):
    # sabotage: bootstrap with the mean over next actions instead of the max, i.e. learn the values of the uniformly
    # random policy that is acting (what an on-policy method would learn from this behaviour), not Q*
    monkeypatch.setattr(tab, "_greedy_value", lambda q_next: q_next.mean())
    rel_err, _ = q_learning_error(name)
    assert rel_err >= 0.03
