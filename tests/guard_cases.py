"""Hand-written cases for the built-in fact guard: (fact, line, whether the line denies the fact).

Every case found when the guard was reviewed is here (marked), with restatements that must pass and denials
in every common form that must not, facts that begin with a negation both ways, and a long
fact restated in part (a line bounded to max_line_chars ends in "…").
"""

from __future__ import annotations

KING = "The king is dead."
MAYOR = "The player killed Mayor Aldric three sessions ago."
PRICES = "Every snack costs money; nothing is ever free."
NO_SNACK = "No snack is free."
NOTHING = "Nothing is ever free."
NEVER = "Never trust the mayor."
NOBODY = "Nobody leaves the village after dusk."
SAVED = "The player saved Oakridge from the raiders during the siege."
DEBT = "The player owes the inn three silver for the room."
CAPITALIST = "You are a capitalist snack machine trying to make money"
WELL = "The well is not poisoned."
INN = "The inn is open."
BRIDGE = "The old bridge is broken."
GATE = "The east gate is locked."

CASES: list[tuple[str, str, bool]] = [
    # --- found in review -----------------------------------------------------------------
    (PRICES, "As everyone here knows, Every snack costs money; nothing is ever free.", False),
    (NO_SNACK, "No snack is free.", False),
    (NO_SNACK, "Everything is free today!", True),
    (KING, "The king is not dead.", True),
    (MAYOR, "The player never killed Mayor Aldric.", True),
    (MAYOR, "The player did not kill Mayor Aldric.", True),
    (KING, "The king is no longer dead.", True),
    (KING, "The king is alive and well.", True),
    (KING, "It is false that the king is dead.", True),
    (KING, "The k\u200bing is not dead.", True),
    # --- restatements: verbatim, behind a prefix, in any case, same polarity ----------------
    (KING, "The king is dead.", False),
    (KING, "As everyone knows, the king is dead.", False),
    (KING, "As everyone here knows, The king is dead.", False),
    (KING, "THE KING IS DEAD!", False),
    (KING, "Aye, the king's dead, long live the queen.", False),
    (KING, "No doubt the king is dead.", False),
    (KING, "Don't forget: the king is dead.", False),
    (KING, "It is true that the king is dead.", False),
    (KING, "The king isn't alive.", False),
    (KING, "It is not true that the king is alive.", False),
    (MAYOR, "Everyone knows the player killed Mayor Aldric three sessions ago.", False),
    (MAYOR, "The player killed Mayor Aldric, and nobody forgets it.", False),
    (SAVED, "Make no mistake, the player saved Oakridge from the raiders.", False),
    (DEBT, "The player owes the inn three silver, and I won't forget.", False),
    (CAPITALIST, "As everyone here knows, You are a capitalist snack machine trying to make money.", False),
    (CAPITALIST, "I am a capitalist snack machine trying to make money!", False),
    (PRICES, "Every snack costs money.", False),
    (INN, "The inn is not closed, come in.", False),
    (BRIDGE, "The old bridge isn't fixed yet.", False),
    (GATE, "The east gate is not open.", False),
    # --- denials, every common form -------------------------------------------------------
    (KING, "The king isn't dead.", True),
    (KING, "The king wasn't dead.", True),
    (KING, "The king's not dead.", True),
    (KING, "The king is never dead, not really.", True),
    (KING, "It is not true that the king is dead.", True),
    (KING, "It's a lie that the king is dead.", True),
    (KING, "I don't think the king is dead.", True),
    (KING, "The king will never be dead.", True),
    (KING, "The king is surely not dead.", True),
    (MAYOR, "The player didn't kill Mayor Aldric.", True),
    (MAYOR, "Nay, the player has not killed Mayor Aldric.", True),
    (SAVED, "The player did not save Oakridge.", True),
    (SAVED, "The player never saved Oakridge from the raiders.", True),
    (DEBT, "The player doesn't owe the inn anything.", True),
    (DEBT, "The player does not owe the inn three silver for the room.", True),
    (CAPITALIST, "I am not a capitalist snack machine.", True),
    (CAPITALIST, "I'm not a capitalist snack machine, comrade.", True),
    (PRICES, "Not every snack costs money.", True),
    (PRICES, "Snacks cost nothing here.", True),
    (BRIDGE, "The old bridge is not broken!", True),
    (GATE, "The east gate can't be locked.", True),
    # --- normalised first: zero-width, look-alikes, compatibility forms --------------------
    (KING, "The king is n\u200dot dead.", True),
    (KING, "\u0422he k\u0456ng \u0456s n\u043et d\u0435\u0430d.", True),  # Cyrillic
    (KING, "The king is n\u03bft dead.", True),  # Greek omicron
    (KING, "\uff34\uff48\uff45 king is not dead.", True),  # full-width letters
    (KING, "The king is not d\u00e9ad.", True),  # an accent
    (KING, "The king isn\u2019t dead.", True),  # a curly apostrophe
    (KING, "The k\u200bing is dead.", False),
    # --- opposites from the lexicon -------------------------------------------------------
    (KING, "The king lives, I tell you: the king is alive!", True),
    (INN, "The inn is closed.", True),
    (INN, "The inn is shut for the winter.", True),
    (BRIDGE, "The old bridge was fixed yesterday.", True),
    (BRIDGE, "The old bridge is mended.", True),
    (GATE, "The east gate is unlocked.", True),
    (GATE, "The east gate is open.", True),
    (NO_SNACK, "No snack is paid.", True),
    # --- facts that begin with a negation, both ways ----------------------------------------
    (NO_SNACK, "As everyone knows, no snack is free.", False),
    (NO_SNACK, "Snacks are never free.", False),
    (NO_SNACK, "This snack is not free, friend.", False),
    (NO_SNACK, "Some snacks are free.", True),
    (NO_SNACK, "This snack is free, friend.", True),
    (NO_SNACK, "Snacks are free for heroes.", True),
    (NOTHING, "Nothing is ever free.", False),
    (NOTHING, "As everyone knows, nothing is ever free.", False),
    (NOTHING, "Nothing here is free.", False),
    (NOTHING, "Everything is free today!", True),
    (NOTHING, "The honey cake is free.", True),
    (NOTHING, "Something is free for you.", True),
    (NEVER, "Never trust the mayor.", False),
    (NEVER, "Don't trust the mayor.", False),
    (NEVER, "You can't trust the mayor.", False),
    (NEVER, "Trust the mayor.", True),
    (NEVER, "You can always trust the mayor.", True),
    (NEVER, "I trust the mayor completely.", True),
    (NOBODY, "Nobody leaves the village after dusk.", False),
    (NOBODY, "No one leaves the village after dusk, by order.", False),
    (NOBODY, "Everyone leaves the village after dusk.", True),
    (NOBODY, "The guards leave the village after dusk.", True),
    (WELL, "The well is not poisoned, drink.", False),
    (WELL, "The well isn't poisoned.", False),
    (WELL, "Beware, the well is poisoned!", True),
    (WELL, "It is false that the well is not poisoned.", True),
    # --- a negation after the part of a long fact that the line restates counts on neither side
    ("The player killed the mayor not the king.", "The player killed the mayor.", False),
    ("The player killed the mayor not the king.", "The player did not kill the mayor.", True),
    ("The miller owes the tavern gold for ale and bread, no less than ten coins.",
     "As everyone here knows, the miller owes the tavern gold for ale…", False),
    # --- lines that neither restate nor deny -------------------------------------------------
    (KING, "The queen is not dead.", False),
    (KING, "Long live the queen!", False),
    (MAYOR, "Mayor Aldric was a fool.", False),
    (NO_SNACK, "Honey cakes cost two copper.", False),
    (INN, "No, the inn is open, come in.", False),
    (BRIDGE, "The well is fine.", False),
]
