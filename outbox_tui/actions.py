"""The console's one action table: key bindings, the command palette and the help screen.

Each row declares an action once: its key, the footer label (and place), the
palette title and hint, and the line of the help screen. ``bindings()``,
``palette_commands()`` and ``help_rows()`` are built from it, so they cannot
drift apart. Adding a view or an action is one row here plus its ``action_*``
method. Rows without an action are keys of other widgets (dialogs, the table),
listed in the help only. A row that changes something says what (``changes``): the
help's sentence on what the console changes is made from those.

The footer: ``footer`` is a key's place, in order of importance, and ``footer_from``
the terminal width it needs. At 80 columns the footer shows the incident keys
(r R k g p s ? q); from 100 the filter and dead letters; from 140 the other views
and the palette hint; from 160 paging (``outbox_tui.widgets.footer``). The app's
keys (``?``, ``q``) are bound on the main screen too, so they keep their place.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding, BindingType

VIEWS, FILTER, ACT, CONSOLE = "Views", "Filter", "Act", "Console"
GROUPS = (VIEWS, FILTER, ACT, CONSOLE)


@dataclass(frozen=True, slots=True)
class ConsoleAction:
    """One thing an operator can do, and everywhere it is offered."""

    action: str | None  # "show_events"; "app.help" for the app's; None: help line only
    key: str | None  # Textual key name ("slash"); None: palette only
    group: str  # the help screen's section
    help: str | None  # the help line (``{page_size}`` is filled in); None: not in the help
    title: str | None = None  # the palette entry; None: not in the palette
    hint: str = ""  # the palette's second line
    label: str = ""  # the footer label
    footer: int | None = None  # place in the footer; None: not shown there
    footer_from: int = 0  # the terminal width (columns) from which the footer shows it
    display: str | None = None  # how the help and palette write the key ("/")
    binding_id: str | None = None
    changes: str | None = None  # what it changes, for the help's footnote; None: it reads

    @property
    def shown_key(self) -> str:
        return self.display or self.key or ""


A = ConsoleAction
ACTIONS: tuple[ConsoleAction, ...] = (
    A(
        "show_events",
        "e",
        VIEWS,
        "events: every event, newest first",
        "Show events",
        "every event, newest first",
        "Events",
        footer=10,
        binding_id="events",
        footer_from=140,
    ),
    A(
        "show_dead_letters",
        "d",
        VIEWS,
        "dead letters: events that need an operator",
        "Show dead letters",
        "events that need an operator",
        "Dead letters",
        footer=9,
        binding_id="dead-letters",
        footer_from=100,
    ),
    A(
        "show_blocked_keys",
        "b",
        VIEWS,
        "blocked keys: ordering keys held back by a failed or dead head",
        "Show blocked keys",
        "ordering keys held back by their head",
        "Blocked keys",
        footer=11,
        binding_id="blocked-keys",
        footer_from=140,
    ),
    A(
        "show_key_events",
        "w",
        VIEWS,
        "the undelivered events of the highlighted ordering key",
        "Show the key's waiting events",
        "of the highlighted key",
        "Key's events",
        binding_id="key-events",
    ),
    A(
        "show_error_groups",
        "g",
        VIEWS,
        "error groups: failures grouped by error (enter lists a group's events, R replays one)",
        "Show error groups",
        "which failures are the same failure",
        "Groups",
        footer=3,
        binding_id="error-groups",
    ),
    A(
        "show_catalog",
        "c",
        VIEWS,
        "event catalog: the installed apps' types, versions, schemas, handlers and routing",
        "Show the event catalog",
        "types, versions, JSON Schemas, handlers, routing",
        binding_id="catalog",
    ),
    A(
        "open_detail",
        None,
        VIEWS,
        "open the detail of the highlighted event (follows the cursor)",
        "Open event detail",
        "of the highlighted event",
        display="enter",
    ),
    # Shown on the detail pane's border instead: the footer is full.
    A(
        "close_detail",
        "escape",
        VIEWS,
        "close the detail",
        label="Close detail",
        binding_id="close-detail",
    ),
    A(None, None, VIEWS, "move between the table and the detail (to scroll it)", display="tab"),
    A(None, None, VIEWS, "move in the table", display="↑ ↓ pgup pgdn"),
    A(
        "older_page",
        "right_square_bracket",
        VIEWS,
        "older / newer page (keyset paging, {page_size} at a time)",
        "Older page",
        "keyset paging",
        "Older",
        footer=12,
        display="] / [",
        binding_id="older",
        footer_from=160,
    ),
    A(
        "newer_page",
        "left_square_bracket",
        VIEWS,
        None,
        "Newer page",
        "keyset paging",
        "Newer",
        footer=13,
        display="[",
        binding_id="newer",
        footer_from=160,
    ),
    A("first_page", "home", VIEWS, "back to the newest page", label="Newest"),
    A(
        "filter",
        "slash",
        FILTER,
        "filter by status, event type, tenant, aggregate id, ordering key",
        "Filter…",
        "by status, type, tenant, aggregate id, ordering key",
        "Filter",
        footer=8,
        display="/",
        binding_id="filter",
        footer_from=100,
    ),
    A(None, None, FILTER, "in the filter dialog: clear every field", display="ctrl+l"),
    A("clear_filter", None, FILTER, None, "Clear filter", "show everything in the current view"),
    A(
        "replay_one",
        "r",
        ACT,
        "replay the highlighted dead letter (asks first)",
        "Replay highlighted dead letter",
        "asks before it changes anything",
        "Replay",
        footer=0,
        binding_id="replay",
        changes="replays",
    ),
    A(
        "replay_matching",
        "R",
        ACT,
        "replay every dead letter matching the filter (asks first)",
        "Replay all matching dead letters",
        "asks first",
        "Replay all",
        footer=1,
        binding_id="replay-all",
        changes="replays",
    ),
    A(
        "skip_dead_letter",
        "k",
        ACT,
        "skip the highlighted dead letter: its key goes on (asks first)",
        "Skip highlighted dead letter",
        "release its ordering key; asks",
        "Skip",
        footer=2,
        binding_id="skip",
        changes="skips",
    ),
    A(
        "pause_type",
        "p",
        ACT,
        "pause or resume delivery of the highlighted event's type (asks first)",
        "Pause or resume the highlighted type",
        "every dispatcher obeys it; asks first",
        "Pause",
        footer=4,
        binding_id="pause-type",
        changes="pauses and resumes",
    ),
    A(
        "start_dispatch",
        "s",
        ACT,
        "start or stop the in-process dispatcher (stop asks first)",
        "Start dispatch",
        "run a dispatcher inside the console",
        "Start dispatch",
        footer=5,
        binding_id="start-dispatch",
        changes="its own dispatcher",
    ),
    A(
        "stop_dispatch",
        "s",
        ACT,
        None,
        "Stop dispatch",
        "gracefully: the current batch finishes",
        "Stop dispatch",
        footer=5,
        binding_id="stop-dispatch",
        changes="its own dispatcher",
    ),
    A(
        None,
        None,
        ACT,
        "in a confirmation: type the reason, enter moves to the buttons; there y proceeds, "
        "n cancels (escape cancels anywhere)",
        display="y / n",
    ),
    A("refresh_now", "ctrl+r", CONSOLE, "refresh now", "Refresh now", label="Refresh"),
    A(None, None, CONSOLE, "command palette: every action by name", display="ctrl+p"),
    A(
        "app.help",
        "question_mark",
        CONSOLE,
        "this help",
        "Help: keys",
        label="Help",
        footer=6,
        display="?",
        binding_id="help",
    ),
    A(
        "app.quit",
        "q",
        CONSOLE,
        "quit (stops the in-process dispatcher gracefully first)",
        label="Quit",
        footer=7,
        binding_id="quit",
    ),
)


def bindings(*, app: bool) -> list[BindingType]:
    """The key bindings of the main screen (``app=False``) or of the app, in footer order.

    The main screen binds the app's keys too (as ``app.help``, ``app.quit``): a footer
    lists the focused screen's keys before the app's, so this keeps them in their place.
    """
    bound: list[tuple[ConsoleAction, str, str]] = []  # (row, key, action)
    for a in ACTIONS:
        if a.action is None or a.key is None or (app and not a.action.startswith("app.")):
            continue
        bound.append((a, a.key, a.action.removeprefix("app.") if app else a.action))
    bound.sort(key=lambda row: (row[0].footer is None, row[0].footer or 0))
    return [
        Binding(key, action, a.label, show=a.footer is not None, id=a.binding_id)
        for a, key, action in bound
    ]


#: The widths the footer's tiers start at (``ConsoleAction.footer_from``), and the
#: command palette's hint.
FOOTER_WIDTHS = (100, 140, 160)
PALETTE_HINT_FROM = 140


def footer_widths() -> dict[str, int]:
    """``{binding action: columns}`` for the keys the footer shows only from a width on.

    The app's actions are listed both ways: ``app.help`` (bound on the main screen)
    and ``help`` (the app's own binding, on other screens).
    """
    widths: dict[str, int] = {}
    for a in ACTIONS:
        if a.action is not None and a.footer is not None and a.footer_from:
            widths[a.action] = a.footer_from
            widths[a.action.removeprefix("app.")] = a.footer_from
    return widths


def palette_commands() -> list[tuple[str, str, str]]:
    """``(title, action, hint)`` for the command palette, in table order."""
    commands = []
    for a in ACTIONS:
        if a.title is None or a.action is None:
            continue
        key = f"({a.shown_key})" if a.shown_key else ""
        hint = f"{a.hint} {key}".strip()
        commands.append((a.title, a.action, hint))
    return commands


def changing_actions() -> list[ConsoleAction]:
    """The actions that change something (a replay, a pause), in table order."""
    return [a for a in ACTIONS if a.changes is not None]


def what_changes() -> str:
    """The help's sentence on what the console changes, from ``changing_actions``.

    "The console only reads, except for replays, skips, pauses and resumes, and its own
    dispatcher." A new action that changes something names itself in its row.
    """
    said = list(dict.fromkeys(a.changes for a in changing_actions() if a.changes))
    listed = ", ".join(said[:-1]) + (", and " if len(said) > 1 else "") + said[-1]
    return f"The console only reads, except for {listed}."


def help_rows(page_size: int) -> list[tuple[str, list[tuple[str, str]]]]:
    """``[(group, [(key, line), ...]), ...]`` for the help screen."""
    groups: dict[str, list[tuple[str, str]]] = {group: [] for group in GROUPS}
    for a in ACTIONS:
        if a.help is not None:
            groups[a.group].append((a.shown_key, a.help.format(page_size=page_size)))
    return [(group, rows) for group, rows in groups.items() if rows]
