"""Species of a database hit, for pairing rows across chains.

fold-data's :func:`fold_data.msa.species_id` reads the UniProt entry mnemonic
(``..._HUMAN``) or the UniProt ``OX=`` taxonomy field; UniRef headers carry ``TaxID=`` instead,
read here as a last resort. ``""``: unknown (the row is never paired).
"""

from __future__ import annotations

import re

from fold_data.msa import species_id

__all__ = ["hit_species"]

_TAXID = re.compile(r"\bTaxID=(?P<taxid>\d+)")


def hit_species(name: str, description: str) -> str:
    found = species_id(f"{name} {description}".strip())
    if found:
        return found
    match = _TAXID.search(description)
    return match.group("taxid") if match else ""
