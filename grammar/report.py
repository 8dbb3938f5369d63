"""Which schema keywords the mask enforces and which only the validation layer checks.

llguidance's lesson: every keyword the grammar cannot enforce is named, never silently dropped. The
report travels with the compiled shape to the caller (CLI verdict, HTTP ``validation.keywords``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True, order=True)
class KeywordNote:
    """One keyword occurrence that the mask does not enforce exactly."""

    pointer: str
    keyword: str
    reason: str


@dataclass
class KeywordCoverage:
    """Collected while normalizing one schema."""

    enforced: set[str] = field(default_factory=set)
    validated_only: list[KeywordNote] = field(default_factory=list)
    #: Where the grammar generates less than the schema allows, by layout choice
    #: (``tokenmold.grammar.object_keys``: unstated ``additionalProperties`` closed, extra keys bounded).
    narrowed: list[KeywordNote] = field(default_factory=list)
    #: What only llguidance enforces (a pattern next to a format, lengths next to either, key
    #: patterns): validated only when the schema compiles with another engine (``for_engine``).
    llguidance_only: set[KeywordNote] = field(default_factory=set)

    def enforce(self, keyword: str) -> None:
        self.enforced.add(keyword)

    def validate_only(self, pointer: str, keyword: str, reason: str) -> None:
        self.validated_only.append(KeywordNote(pointer, keyword, reason))

    def narrow(self, pointer: str, keyword: str, reason: str) -> None:
        self.narrowed.append(KeywordNote(pointer, keyword, reason))

    def for_engine(self, engine: str) -> KeywordCoverage:
        """The report as the engine that compiled the schema enforces it."""
        if engine == "llguidance" or not self.llguidance_only:
            return self
        noted = {(note.pointer, note.keyword) for note in self.validated_only}
        extra = [note for note in sorted(self.llguidance_only) if (note.pointer, note.keyword) not in noted]
        return replace(self, validated_only=[*self.validated_only, *extra], llguidance_only=set())

    @property
    def validated_only_keywords(self) -> set[str]:
        return {note.keyword for note in self.validated_only}

    def notes(self) -> list[KeywordNote]:
        """The validated-only notes, each once, in pointer order."""
        return sorted(set(self.validated_only))

    def as_dict(self) -> dict[str, object]:
        return {
            "enforced": sorted(self.enforced),
            "validated_only": [{"pointer": n.pointer, "keyword": n.keyword, "reason": n.reason} for n in self.notes()],
            "narrowed": [
                {"pointer": n.pointer, "keyword": n.keyword, "reason": n.reason} for n in sorted(set(self.narrowed))
            ],
        }
