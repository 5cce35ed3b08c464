"""The command palette (ctrl+p) offers every action of the action table by name."""

from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

from outbox_tui.actions import palette_commands

COMMANDS = palette_commands()


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
