"""Training side: the Task protocol, the reference GPT task, data, the pipeline schedule, checkpoints."""
