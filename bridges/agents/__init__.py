"""Agents that live in other programs, trained unchanged: per-rollout sessions and the environment
that runs an agent against one.

``sessions`` (the record of one rollout's calls, and what a session refuses), ``responses_dialect``
and ``anthropic_dialect`` (the other two wire formats, as chat calls), ``streams`` (a recorded
answer re-cut as the stream an agent asked for), ``session_routes`` (a request answered whatever
server carries it), ``loopback`` (that server inside a training process, in the rollouts' event
loop), ``in_process`` (a session as a client object, no socket, for code in this process), ``agent_run`` (running the agent, bounded) and ``agent_env`` (``AgentEnv``).

May import: ``bridges.client`` (the chat call and its JSON), ``bridges.envs`` (the environment API),
``bridges.runtime``. Must not import runs, backends or applications: a backend hands ``AgentEnv`` its
client like any environment's.
"""
