"""One temperature, applied in one place (`docs/ARCHITECTURE.md`): `lit_rlhf.ops.apply_temperature`
divides logits by the sampling temperature for the sampler and for every log-prob path, and each
method's default is its paper's."""

from __future__ import annotations

import ast
import math
import inspect
from pathlib import Path

import pytest
import torch

from lit_rlhf.generation import SamplingConfig
from lit_rlhf.modules import GRPOModule, PPOModule, RLOOModule
from lit_rlhf.modules.online import OnlineModule
from lit_rlhf.ops import apply_temperature

PACKAGE = Path(__file__).resolve().parent.parent / "lit_rlhf"


def test_apply_temperature():
    logits = torch.tensor([[1.0, -2.0, 0.5]])
    assert apply_temperature(logits, 1.0) is logits  # the identity: no copy
    torch.testing.assert_close(apply_temperature(logits, 0.5), torch.tensor([[2.0, -4.0, 1.0]]))
    assert logits.tolist() == [[1.0, -2.0, 0.5]]  # not in place unless asked
    assert apply_temperature(logits, 0.5, inplace=True) is logits and logits.tolist() == [[2.0, -4.0, 1.0]]
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="temperature must be > 0"):
            apply_temperature(logits, bad)


def _mentions_temperature(node: ast.AST) -> bool:
    return "temperature" in ast.unparse(node)


def divisions_by_a_temperature(tree: ast.AST) -> list[int]:
    """Lines dividing by something named like a temperature, outside `apply_temperature` itself:
    `x / t`, `x /= t`, `x.div(t)`, `x.div_(t)`, `torch.div(x, t)`, `x.true_divide(t)`."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "apply_temperature":
            skip |= {id(inner) for inner in ast.walk(node)}
    lines = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, ast.Div):
            if _mentions_temperature(node.right if isinstance(node, ast.BinOp) else node.value):
                lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("div", "div_", "true_divide", "true_divide_") and node.args:
                if _mentions_temperature(node.args[-1]):
                    lines.append(node.lineno)
    return sorted(lines)


def test_the_finder_sees_every_form_of_division():
    code = "a = x / temperature\nx /= self.temperature\nz.div_(temperature)\ntorch.div(x, cfg.temperature)\ny = x / 2\n"
    assert divisions_by_a_temperature(ast.parse(code)) == [1, 2, 3, 4]


def test_only_apply_temperature_divides_logits_by_the_temperature():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += [f"{path.relative_to(PACKAGE.parent)}:{line}" for line in divisions_by_a_temperature(ast.parse(path.read_text()))]
    assert not found, "divide through lit_rlhf.ops.apply_temperature instead:\n" + "\n".join(found)


def default(cls, name: str):
    return inspect.signature(cls.__init__).parameters[name].default


def test_each_method_samples_at_its_papers_temperature_by_default():
    assert default(PPOModule, "temperature") == 0.7  # N+ (Huang et al. 2024): TL;DR PPO samples at 0.7
    assert default(GRPOModule, "temperature") == 1.0  # DeepSeekMath's GRPO: the policy's own distribution
    assert default(RLOOModule, "temperature") == 1.0  # Ahmadian et al. 2024: the policy's own distribution
    # the shared settings leave the distribution as the model gives it; a method states its own
    assert default(OnlineModule, "temperature") == 1.0
    assert SamplingConfig().temperature == 1.0


def test_the_log_prob_of_a_token_at_two_temperatures_by_hand():
    # one next-token distribution over 3 tokens, logits (2, 0, 0); the scored token is token 0:
    # log softmax(z / T)_0 = 2/T - log(exp(2/T) + 2)
    from lit_rlhf.ops import token_logps_from_logits

    logits = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]]])  # (1, 2, 3): position 0 predicts token 1's id
    ids = torch.tensor([[1, 0]])
    at_one = token_logps_from_logits(logits, ids, temperature=1.0)[0, 1]
    at_half = token_logps_from_logits(logits, ids, temperature=0.5)[0, 1]
    assert at_one.item() == pytest.approx(2 - math.log(math.exp(2) + 2), abs=1e-6)  # -0.2395
    assert at_half.item() == pytest.approx(4 - math.log(math.exp(4) + 2), abs=1e-6)  # -0.0360: sharper at 0.5


def test_greedy_decoding_takes_any_temperature():
    for temperature in (0.0, 0.3, 1.0, 2.0):
        assert not SamplingConfig(temperature=temperature, do_sample=False).do_sample
    greedy = SamplingConfig.greedy(7)
    assert (greedy.max_new_tokens, greedy.do_sample, greedy.temperature) == (7, False, 0.0)
    with pytest.raises(ValueError, match="temperature must be > 0 when sampling"):
        SamplingConfig(temperature=0.0)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        SamplingConfig(temperature=-1.0, do_sample=False)


def test_greedy_responses_do_not_depend_on_the_temperature(tiny_model, tiny_tokenizer):
    from lit_rlhf.generation import generate_responses

    ids = tiny_tokenizer(["hello there"], add_special_tokens=False, return_tensors="pt")["input_ids"].repeat(2, 1)  # (2, P)
    mask = torch.ones_like(ids, dtype=torch.bool)
    eos, pad = tiny_tokenizer.eos_token_id, tiny_tokenizer.pad_token_id
    outputs = [generate_responses(tiny_model, ids, mask, SamplingConfig(max_new_tokens=5, temperature=t, do_sample=False),
                                  eos, pad)[0] for t in (0.0, 0.3, 1.0)]
    assert torch.equal(outputs[0], outputs[1]) and torch.equal(outputs[0], outputs[2])
    assert torch.equal(outputs[0], generate_responses(tiny_model, ids, mask, SamplingConfig.greedy(5), eos, pad)[0])
