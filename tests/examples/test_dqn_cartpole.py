"""examples/dqn_cartpole.py: deep Q-learning on gymnasium's CartPole-v1 runs end to end and
repeats exactly under its seed (the full run, which learns, takes about half a minute and is
not run here). Skipped when gymnasium (the ``rl`` extra) is not installed."""
import copy
import runpy

import numpy as np
import pytest

import nnkit as nn

from tests.examples.helpers import ROOT, run_example

gym = pytest.importorskip("gymnasium", reason="the rl extra (gymnasium) is not installed: "
                                                "pip install -e '.[rl]'")


def test_dqn_quick_command_line_runs_and_repeats():
    first = run_example("dqn_cartpole.py", "--quick", timeout=120)
    lines = first.strip().splitlines()
    assert lines[0].startswith("step    300: epsilon ")
    assert lines[-2].startswith("600 steps, ")
    assert lines[-1].startswith("greedy return: ")
    assert 8 <= float(lines[-1].split(": ")[1]) <= 500
    second = run_example("dqn_cartpole.py", "--quick", timeout=120)

    def without_times(out):
        return [line.split(" in ")[0] for line in out.splitlines()]
    assert without_times(second) == without_times(first)          # seeded: the same run


@pytest.fixture(scope="module")
def example():
    return runpy.run_path(str(ROOT / "examples" / "dqn_cartpole.py"), run_name="dqn_cartpole")


def test_replay_buffer_keeps_the_last_transitions(example):
    memory = example["ReplayBuffer"](3, 2)
    for i in range(5):
        memory.add([i, i], i % 2, 1.0, [i + 1, i + 1], i == 4)
    assert len(memory) == 3
    assert sorted(memory.states[:, 0]) == [2, 3, 4]              # the oldest two overwritten
    s, a, r, s2, ends = memory.sample(16, np.random.default_rng(0))
    assert s.shape == s2.shape == (16, 2) and a.shape == r.shape == ends.shape == (16,)
    assert np.all(s2 == s + 1) and np.all(ends == (s[:, 0] == 4))


def test_a_short_run_trains_the_q_network_and_its_target_is_a_copy(example, capsys):
    main, q_network = example["main"], example["q_network"]
    q = q_network(4, 2, hidden=8)
    target = copy.deepcopy(q)
    assert target.vars[0] is not q.vars[0]
    assert all(np.array_equal(a, b) for a, b in zip(target.state().values(),
                                                      q.state().values()))
    result = main(steps=400, hidden=16, learning_starts=100, train_every=50, updates=10,
                  epsilon_steps=300, eval_every=200, eval_episodes=1, final_episodes=1,
                  verbose=False)
    assert capsys.readouterr().out.startswith("greedy return: ")
    assert result["steps"] == 400 and len(result["evaluations"]) == 2
    assert len(result["returns"]) > 0 and sum(result["returns"]) <= 400
    nn.seed(0)
    start = q_network(4, 2, hidden=16).state()           # what main's seed 0 started from
    trained = result["model"].state()
    assert list(trained) == list(start) == ["layers.0.W", "layers.0.b", "layers.2.W",
                                            "layers.2.b", "layers.4.W", "layers.4.b"]
    assert all(not np.array_equal(trained[name], start[name]) for name in start)
