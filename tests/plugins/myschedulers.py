# myschedulers.py
from portbench.sim.schedulers import BaseScheduler, register_scheduler


@register_scheduler
class AgingSJF(BaseScheduler):
    """Shortest prompt first with aging: a request's key falls by `rate` tokens per second since it
    arrived, so a long prompt is served once it has waited long enough (no starvation)."""

    name = "aging_sjf"
    information = "prompt"          # none | arrival | prompt | predicted | oracle | tenant
    models = "SJF on prompt length with linear aging (example)"
    OPTIONS = {"rate": 200.0}       # tokens per second waited; simulation.scheduler_options.aging_sjf.rate

    def priority(self, r, now):     # lower = served first; ties by arrival
        return r.prompt_tokens - self.rate * (now - r.arrival_s)


@register_scheduler
class LongestPromptFirst(BaseScheduler):
    """Longest prompt first (a static example): the key depends on the request only."""

    name = "lpf"
    information = "prompt"
    models = "longest prompt first (example)"
    static_priority = True          # ranked once at arrival; the engine checks that now does not matter

    def priority(self, r, now):
        return -r.prompt_tokens
