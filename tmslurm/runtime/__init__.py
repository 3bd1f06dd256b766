"""Runtime: controller, agents (worker and standby), their protocol, the event journal, process spawners."""
