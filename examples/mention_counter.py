"""A complete custom block: counts how often the user mentions a name in flushed batches.

Configure it with
    [[blocks]]
    kind = "python"
    path = "mention_counter:MentionCounter"   # the module must be importable (PYTHONPATH)
    who = "Rex"
"""

from memcli import MemoryBlock


class MentionCounter(MemoryBlock):
    """`The user has mentioned Rex 3 times.` Its count lives in the store, per user."""

    def __init__(self, name="mentions", who="Rex", priority=3, **kwargs):
        super().__init__(name=name, priority=priority, **kwargs)
        self.who = who

    def put(self, batch, ctx):
        said = sum(m.content.lower().count(self.who.lower()) for m in batch if m.role == "user")
        if said:
            state = self.load_state(ctx, {"count": 0})
            self.save_state(ctx, {"count": state["count"] + said})

    def get(self, messages, ctx):
        count = self.load_state(ctx, {"count": 0})["count"]
        return f"The user has mentioned {self.who} {count} times." if count else ""
