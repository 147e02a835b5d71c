"""The gymnasium algorithms, one module each, all with the same shape:
``minirl.algos.<name>.<Name>Config`` and ``minirl.algos.<name>.train(cfg) -> TrainResult`` (``.policy``, ``.history``).
"""

ALGOS = ("reinforce", "ppo", "trpo", "grpo", "dqn")
