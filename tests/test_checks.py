"""minirl.checks: the package's own functions pass, nbgrader's stub is "not implemented yet", and bugs a student
could really write fail with the expected value, the returned one and the hint that points at the bug."""

import functools
import re
import time

import pytest
import torch

from minirl import checks, losses, natural, returns, tabular
from minirl.algos import dqn
from minirl.checks import CheckFailed
from minirl.checks.__main__ import main
from minirl.lm import pipeline, rewards, rlhf, sampling, tasks

# --- realistic bugs, one or two per check ---


def td_target_bootstraps_on_termination(rew, next_q, terminated, gamma):
    return rew + gamma * next_q.max(dim=-1).values


def td_target_max_of_the_batch(rew, next_q, terminated, gamma):
    return rew + gamma * (~terminated).to(rew.dtype) * next_q.max()


def theorem_with_normalised_visitation(mdp, theta):
    return (1 - mdp.gamma) * tabular.policy_gradient_theorem(mdp, theta)


def returns_without_discount(rew, done, gamma, reward_to_go=True):
    return returns.discounted_returns(rew, done, 1.0, reward_to_go)


def returns_without_reset(rew, done, gamma, reward_to_go=True):
    return returns.discounted_returns(rew, torch.zeros_like(done), gamma, reward_to_go)


def fvp_without_damping(kl, params, damping=0.0):
    return natural.fisher_vector_product(kl, params, 0.0)


def fvp_without_retain_graph(kl, params, damping=0.0):
    grad_kl = torch.cat([g.reshape(-1) for g in torch.autograd.grad(kl, params, create_graph=True)])  # (P,)

    def Fvp(v):
        hv = torch.autograd.grad(grad_kl @ v, params)  # frees the graph: a second call fails
        return torch.cat([h.reshape(-1) for h in hv]) + damping * v

    return Fvp


def cg_returns_b(Avp, b, iters=10, tol=1e-10):
    return b


def cg_steepest_descent(Avp, b, iters=10, tol=1e-10):
    x, r = torch.zeros_like(b), b.clone()
    for _ in range(iters):
        if r @ r <= tol:
            break
        Ar = Avp(r)
        alpha = (r @ r) / (r @ Ar)
        x, r = x + alpha * r, r - alpha * Ar  # p = r: no conjugate directions
    return x


def ppo_min_of_negated_terms(logp, old_logp, adv, clip_low=0.2, clip_high=None):
    ratio = torch.exp(logp - old_logp)
    clipped = ratio.clamp(1 - clip_low, 1 + (clip_low if clip_high is None else clip_high))
    return torch.min(-ratio * adv, -clipped * adv)


def ppo_objective_not_negated(logp, old_logp, adv, clip_low=0.2, clip_high=None):
    return -losses.ppo_clip_loss(logp, old_logp, adv, clip_low, clip_high)


def ppo_detached_ratio(logp, old_logp, adv, clip_low=0.2, clip_high=None):
    return losses.ppo_clip_loss(logp.detach(), old_logp, adv, clip_low, clip_high).requires_grad_(True)


def gae_without_reset(rew, val, next_val, terminated, truncated, gamma, lam):
    never = torch.zeros_like(terminated)
    delta = rew + gamma * (~terminated).to(rew.dtype) * next_val - val  # terminations right in delta ...
    adv, _ = returns.gae(delta, torch.zeros_like(val), torch.zeros_like(val), never, never, gamma * lam, 1.0)
    return adv, adv + val  # ... but the sum runs on into the next episode


def gae_truncation_as_termination(rew, val, next_val, terminated, truncated, gamma, lam):
    return returns.gae(rew, val, next_val, terminated | truncated, torch.zeros_like(truncated), gamma, lam)


def gae_ret_is_adv(rew, val, next_val, terminated, truncated, gamma, lam):
    adv, _ = returns.gae(rew, val, next_val, terminated, truncated, gamma, lam)
    return adv, adv


def gae_float32_buffer(rew, val, next_val, terminated, truncated, gamma, lam):
    adv, ret = returns.gae(rew, val, next_val, terminated, truncated, gamma, lam)
    return adv.float(), ret.float()


def group_advantages_without_std(rewards, group_size, scale="group", eps=1e-4):
    grouped = rewards.view(-1, group_size)
    return (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)


def group_advantages_without_eps(rewards, group_size, scale="group", eps=1e-4):
    grouped = rewards.view(-1, group_size)
    return ((grouped - grouped.mean(dim=1, keepdim=True)) / grouped.std(dim=1, keepdim=True)).reshape(-1)


def token_logprobs_without_shift(logits, ids, temperature=1.0):
    return torch.log_softmax(logits / temperature, dim=-1).gather(-1, ids[..., None]).squeeze(-1)


def token_logprobs_log_of_softmax(logits, ids, temperature=1.0):
    probs = torch.softmax(logits[:, :-1] / temperature, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(torch.log(probs), (1, 0))


def bradley_terry_sign_flipped(chosen, rejected):
    return -torch.nn.functional.logsigmoid(rejected - chosen)


def bradley_terry_log_of_sigmoid(chosen, rejected):
    return -torch.log(torch.sigmoid(chosen - rejected))


def token_rewards_score_on_every_token(score, logp, ref_logp, mask, ended, beta):
    rew = -beta * (logp - ref_logp) * mask
    return rew + torch.where(ended, score, torch.zeros_like(score))[:, None] * mask


def token_rewards_score_in_last_column(score, logp, ref_logp, mask, ended, beta):
    rew = -beta * (logp - ref_logp) * mask
    rew[:, -1] += torch.where(ended, score, torch.zeros_like(score))
    return rew


def k3_written_as_k1(logp, ref_logp, kind):
    return losses.kl(logp, ref_logp, "k1")


def kl_log_ratio_reversed(logp, ref_logp, kind):
    return losses.kl(ref_logp, logp, kind)


def format_reward_search(prompts, completions, answers):
    return [float(re.search(r"<think>.*</think><answer>.*", text, re.DOTALL) is not None) for text in completions]


def format_reward_without_dotall(prompts, completions, answers):
    pattern = re.compile(r"<think>[^<]*</think><answer>[^<]*</answer>")
    return [float(pattern.fullmatch(text.replace("\n", "")) is not None and "\n" not in text) for text in completions]


def verified_ignores_format(task, problem, text):
    return tasks.is_correct(task, problem, text)


def verified_string_equality(task, problem, text):
    return tasks.format_ok(text) and tasks.extract_answer(text) == problem.answer


K1, K2, K3 = (functools.partial(checks.check_kl, kind=k) for k in ("k1", "k2", "k3"))

# check, the package's function, [(a realistic bug, words of the hint it must get)]
CHECKS = {
    "td_target": (checks.check_td_target, dqn.td_target, [
        (td_target_bootstraps_on_termination, "Multiply the bootstrap by (1 - terminated)"),
        (td_target_max_of_the_batch, "not the max of the whole batch"),
    ]),
    "policy_gradient_theorem": (checks.check_policy_gradient_theorem, tabular.policy_gradient_theorem, [
        (theorem_with_normalised_visitation, "sums to 1 / (1 - gamma)"),
    ]),
    "discounted_returns": (checks.check_discounted_returns, returns.discounted_returns, [
        (returns_without_discount, "gamma * G_{t+1}"),
        (returns_without_reset, "(1 - done_t)"),
    ]),
    "fisher_vector_product": (checks.check_fisher_vector_product, natural.fisher_vector_product, [
        (fvp_without_damping, "add damping * v"),
        (fvp_without_retain_graph, "retain_graph=True"),
    ]),
    "conjugate_gradient": (checks.check_conjugate_gradient, natural.conjugate_gradient, [
        (cg_returns_b, "calling Avp(p)"),
        (cg_steepest_descent, "p = r_new + (r_new.r_new / r.r) p"),
    ]),
    "ppo_clip_loss": (checks.check_ppo_clip_loss, losses.ppo_clip_loss, [
        (ppo_min_of_negated_terms, "Taking the min of the negated terms"),
        (ppo_objective_not_negated, "the objective negated"),
        (ppo_detached_ratio, "keep logp in the graph"),
    ]),
    "gae": (checks.check_gae, returns.gae, [
        (gae_without_reset, "A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1}"),
        (gae_truncation_as_termination, "a truncation (time limit) is not a termination"),
        (gae_ret_is_adv, "ret = adv + val"),
        (gae_float32_buffer, "dtype expected float64, got float32"),
    ]),
    "group_advantages": (checks.check_group_advantages, returns.group_advantages, [
        (group_advantages_without_std, "std of its group + eps"),
        (group_advantages_without_eps, "never NaN"),
    ]),
    "token_logprobs": (checks.check_token_logprobs, checks.lm.reference_token_logprobs, [
        (token_logprobs_without_shift, "score the NEXT token"),
        (token_logprobs_log_of_softmax, "torch.log_softmax computes the same number exactly"),
    ]),
    "bradley_terry_loss": (checks.check_bradley_terry_loss, losses.bradley_terry_loss, [
        (bradley_terry_sign_flipped, "prefer the rejected completion"),
        (bradley_terry_log_of_sigmoid, "logsigmoid"),
    ]),
    "token_rewards": (checks.check_token_rewards, rlhf.token_rewards, [
        (token_rewards_score_on_every_token, "on the last token only"),
        (token_rewards_score_in_last_column, "last True column of the mask"),
    ]),
    "kl_k1": (K1, losses.kl, [(kl_log_ratio_reversed, "mind the order")]),
    "kl_k2": (K2, losses.kl, [(k3_written_as_k1, "k2 = (log r)^2 / 2")]),
    "kl_k3": (K3, losses.kl, [(k3_written_as_k1, "k3 = (r - 1) - log r"), (kl_log_ratio_reversed, "mind the order")]),
    "format_reward": (checks.check_format_reward, rewards.format_reward, [
        (format_reward_search, "all four tags must be there"),
        (format_reward_without_dotall, "re.DOTALL"),
    ]),
    "verified": (checks.check_verified, pipeline.verified, [
        (verified_ignores_format, "check the format too"),
        (verified_string_equality, "task.same_answer"),
    ]),
}
BUGS = [(name, bug, words) for name, (_, _, bugs) in CHECKS.items() for bug, words in bugs]


@pytest.fixture(autouse=True)
def one_thread(one_thread):
    yield


@pytest.mark.parametrize("name", list(CHECKS))
def test_the_package_function_passes(name, capsys):
    check, reference, _ = CHECKS[name]
    check(reference)
    assert re.fullmatch(r"check_\w+( \(k\d\))?: pass \(\d+ cases\)\n", capsys.readouterr().out)


@pytest.mark.parametrize("name", list(CHECKS))
def test_the_stub_is_not_implemented_yet(name):
    def my_function(*args):
        # YOUR CODE HERE
        raise NotImplementedError()

    stub = r"my_function is not implemented yet: replace the `raise NotImplementedError\(\)` with your code"
    with pytest.raises(CheckFailed, match=stub):
        CHECKS[name][0](my_function)


@pytest.mark.parametrize("name, bug, words", BUGS, ids=[bug.__name__ for _, bug, _ in BUGS])
def test_a_realistic_bug_fails_with_expected_got_and_the_hint(name, bug, words):
    with pytest.raises(CheckFailed) as failure:
        CHECKS[name][0](bug)
    message = str(failure.value)
    assert f"{bug.__name__} fails on case '" in message and "inputs:" in message
    if "raised" not in message:
        assert "expected" in message and "got" in message
    hint = message.split("\n  hint: ")[1]
    assert words in (hint if "dtype" not in words else message), message


def test_checks_are_assertion_errors_and_fast():
    assert issubclass(CheckFailed, AssertionError)  # pytest and nbgrader count a failed check as a failed test
    for check, reference, _ in CHECKS.values():
        t0 = time.perf_counter()
        check(reference)
        assert time.perf_counter() - t0 < 0.5, check


def test_checks_leave_the_global_random_state_alone():
    """A notebook's later cells draw from torch's global generator: an exercise cell must not move it."""
    state = torch.random.get_rng_state()
    for check, reference, _ in CHECKS.values():
        check(reference)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_an_exception_names_the_error_and_the_line():
    def my_gae(rew, val, next_val, terminated, truncated, gamma, lam):
        not_done = 1 - terminated  # torch refuses `-` on a bool tensor
        return rew * not_done, rew

    with pytest.raises(CheckFailed) as failure:
        checks.check_gae(my_gae)
    message = str(failure.value)
    assert "my_gae raised RuntimeError: Subtraction, the `-` operator, with a bool tensor" in message
    assert "not_done = 1 - terminated" in message  # the student's own line


def test_a_wrong_shape_and_a_wrong_type_are_named():
    with pytest.raises(CheckFailed, match=r"output: shape expected \(5,\), got \(4,\)"):
        checks.check_discounted_returns(lambda rew, done, gamma, reward_to_go=True: rew[:-1])
    with pytest.raises(CheckFailed, match=r"expected a torch.Tensor of shape \(5,\), got list"):
        checks.check_discounted_returns(lambda rew, done, gamma, reward_to_go=True: rew.tolist())
    with pytest.raises(CheckFailed, match=r"expected a tuple \(adv, ret\), got a tensor"):
        checks.check_gae(lambda *args: returns.gae(*args)[0])
    with pytest.raises(CheckFailed, match="expected True or False, got Match"):
        checks.check_verified(lambda task, problem, text: re.fullmatch(".*", text))


def test_a_torch_not_implemented_error_is_not_taken_for_the_stub():
    def my_kl(logp, ref_logp, kind):
        raise NotImplementedError("the derivative for this op is not implemented")

    with pytest.raises(CheckFailed, match="my_kl raised NotImplementedError: the derivative"):
        checks.check_kl(my_kl, "k3")


def test_check_kl_names_the_allowed_kinds():
    with pytest.raises(ValueError, match=r"kind must be one of \('k1', 'k2', 'k3'\), got 'k4'"):
        checks.check_kl(losses.kl, "k4")


def test_the_token_logprob_reference_is_the_layout_of_lm_logprobs():
    """The reference of check_token_logprobs against minirl.lm.logprobs, on a model that returns fixed logits."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 6, 9, generator=gen)  # (B, L, V)
    ids = torch.randint(9, (3, 6), generator=gen)  # (B, L)

    class FixedLogits(torch.nn.Module):
        def forward(self, input_ids, attention_mask, position_ids):
            return type("Output", (), {"logits": logits})()

    mask = torch.ones(3, 6, dtype=torch.bool)
    for temperature in (0.5, 1.0, 2.0):
        expected = sampling.logprobs(FixedLogits(), ids, mask, temperature)
        assert torch.allclose(checks.lm.reference_token_logprobs(logits, ids, temperature), expected, atol=1e-6)


STUDENT = '''
import torch
from minirl import returns


def my_gae(rew, val, next_val, terminated, truncated, gamma, lam):
    return returns.gae(rew, val, next_val, terminated, truncated, gamma, lam)


def bradley_terry_loss(chosen, rejected):
    return -torch.log(torch.sigmoid(chosen - rejected))


def helper():
    pass
'''


def test_grading_a_file_from_the_command_line(tmp_path, capsys):
    """``python -m minirl.checks student.py`` runs ``main``; called here in-process, to skip a second torch import."""
    good, bad, empty = tmp_path / "good.py", tmp_path / "bad.py", tmp_path / "empty.py"
    good.write_text(STUDENT.split("\n\ndef bradley_terry_loss")[0])
    bad.write_text(STUDENT)
    empty.write_text("x = 1\n")

    assert main([str(good)]) == 0
    out = capsys.readouterr().out
    assert "check_gae: pass" in out and "1 of 1 checks passed" in out
    assert main([str(bad)]) == 1
    out = capsys.readouterr().out
    assert "check_gae: pass" in out and "bradley_terry_loss fails on case 'large score gaps" in out
    assert "1 of 2 checks passed" in out
    assert main([str(empty)]) == 1
    assert "defines none of the functions checked" in capsys.readouterr().err
