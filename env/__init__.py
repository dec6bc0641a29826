"""The agent harness: sandbox, tools, tool-call protocol, task format, episode loop, policies.

Training, evaluation and the self-hosted agent all act through `env.episode.run_episode`.
"""
