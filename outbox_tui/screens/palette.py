"""The command palette (ctrl+p) offers every key's action by name."""

from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("Show events", "show_events", "every event, newest first (e)"),
    ("Show dead letters", "show_dead_letters", "events that need an operator (d)"),
    ("Show blocked keys", "show_blocked_keys", "ordering keys held back by their head (b)"),
    ("Show the key's waiting events", "show_key_events", "of the highlighted key (w)"),
    ("Filter…", "filter", "by status, type, tenant, aggregate id, ordering key (/)"),
    ("Clear filter", "clear_filter", "show everything in the current view"),
    ("Open event detail", "open_detail", "of the highlighted event (enter)"),
    ("Replay highlighted dead letter", "replay_one", "asks before it changes anything (r)"),
    ("Replay all matching dead letters", "replay_matching", "asks first (R)"),
    ("Skip highlighted dead letter", "skip_dead_letter", "release its ordering key; asks (k)"),
    ("Start dispatch", "start_dispatch", "run a dispatcher inside the console (s)"),
    ("Stop dispatch", "stop_dispatch", "gracefully: the current batch finishes (s)"),
    ("Older page", "older_page", "keyset paging (])"),
    ("Newer page", "newer_page", "keyset paging ([)"),
    ("Refresh now", "refresh_now", "(ctrl+r)"),
    ("Help: keys", "app.help", "(?)"),
)


class ConsoleCommands(Provider):
    """Actions of the main screen; ones its ``check_action`` refuses are not offered."""

    def _available(self) -> list[tuple[str, str, str]]:
        screen = self.screen
        return [
            (name, action, help_text)
            for name, action, help_text in COMMANDS
            if action.startswith("app.") or screen.check_action(action, ())
        ]

    async def discover(self) -> Hits:
        for name, action, help_text in self._available():
            yield DiscoveryHit(name, partial(self.screen.run_action, action), help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, action, help_text in self._available():
            score = matcher.match(name)
            if score > 0:
                yield Hit(
                    score,
                    matcher.highlight(name),
                    partial(self.screen.run_action, action),
                    text=name,
                    help=help_text,
                )
