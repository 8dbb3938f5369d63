"""Extraction tasks for ``tokenmold bench budget``: a document and the schema a client would send.

The schemas are written as pydantic writes them (``model_json_schema()``): objects that do not say
``additionalProperties``, every field without a default required, titles left out for brevity, and
the bounds a careful client sets (``max_length``); prices in cents, because the embedded model
otherwise writes ``1.5555…`` until the repetition guard stops it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ExtractionTask:
    name: str
    document: str
    schema: dict[str, Any]

    @property
    def prompt(self) -> str:
        return f"Extract the {self.name} from this text as JSON.\n\n{self.document}"


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


_STR = {"type": "string"}
_STRS = {"type": "array", "items": {"type": "string"}}

TASKS: tuple[ExtractionTask, ...] = (
    ExtractionTask(
        "person",
        "Grace Hopper, 85, lived in Arlington, Virginia. She was known for COBOL, compilers and teaching. "
        "Reach her office at grace.hopper@navy.mil.",
        _object(
            {"name": _STR, "age": {"type": "integer"}, "city": _STR, "email": _STR, "skills": _STRS},
            ["name", "age", "city", "email", "skills"],
        ),
    ),
    ExtractionTask(
        "invoice",
        "Invoice INV-2291 from Northwind Traders, dated 2026-03-14. 3 x Widget at 4.50 USD, 1 x Gadget at "
        "19.99 USD. Total due: 33.49 USD.",
        _object(
            {
                "invoice_number": _STR,
                "date": _STR,
                "vendor": _STR,
                "currency": {"enum": ["USD", "EUR", "GBP"]},
                "total": {"type": "number"},
                "line_items": {
                    "type": "array",
                    "items": _object(
                        {
                            "description": _STR,
                            "quantity": {"type": "integer"},
                            "unit_cents": {"type": "integer", "minimum": 0, "maximum": 10**7},
                        },
                        ["description", "quantity", "unit_cents"],
                    ),
                },
            },
            ["invoice_number", "date", "vendor", "currency", "total", "line_items"],
        ),
    ),
    ExtractionTask(
        "event",
        "The Rust Meetup Berlin takes place on 12 May 2026 at c-base, Rungestrasse 20. Speakers: Ana Lima, "
        "Tom Becker and Yuki Sato. Entry is free.",
        _object(
            {"title": _STR, "date": _STR, "location": _STR, "speakers": _STRS, "free": {"type": "boolean"}},
            ["title", "date", "location", "speakers", "free"],
        ),
    ),
    ExtractionTask(
        "product",
        "The Aeropress Go coffee maker costs 39.95 EUR and is in stock. Categories: kitchen, coffee, travel. "
        "Customers rate it 4.7 out of 5.",
        _object(
            {
                "name": _STR,
                "price": {"type": "number"},
                "in_stock": {"type": "boolean"},
                "categories": {"type": "array", "items": _STR, "maxItems": 5},
                "rating": {"type": "number", "minimum": 0, "maximum": 5},
            },
            ["name", "price", "in_stock", "categories", "rating"],
        ),
    ),
    ExtractionTask(
        "job posting",
        "Acme Robotics is hiring a Senior Firmware Engineer in Lyon (remote possible). Salary 65,000 to "
        "80,000 EUR. Requirements: C, embedded Linux, five years of experience.",
        _object(
            {
                "title": _STR,
                "company": _STR,
                "location": _STR,
                "remote": {"type": "boolean"},
                "salary_min": {"type": "integer"},
                "salary_max": {"type": "integer"},
                "requirements": _STRS,
            },
            ["title", "company", "location", "remote", "salary_min", "salary_max", "requirements"],
        ),
    ),
    ExtractionTask(
        "meeting notes",
        "Budget review, 2 June. Decided: freeze hiring until Q3; move the offsite to October. Actions: Priya "
        "drafts the Q3 plan by 10 June; Marc updates the forecast by 6 June.",
        _object(
            {
                "topic": _STR,
                "decisions": _STRS,
                "action_items": {
                    "type": "array",
                    "items": _object({"owner": _STR, "task": _STR, "due": _STR}, ["owner", "task", "due"]),
                },
            },
            ["topic", "decisions", "action_items"],
        ),
    ),
    ExtractionTask(
        "address",
        "Please ship to: Maria Gonzalez, Calle de Alcala 48, 28014 Madrid, Spain. Phone +34 600 123 456.",
        _object(
            {
                "recipient": _STR,
                "street": _STR,
                "postal_code": {"type": "string", "maxLength": 10},
                "city": _STR,
                "country": _STR,
                "phone": {"anyOf": [_STR, {"type": "null"}]},
            },
            ["recipient", "street", "postal_code", "city", "country"],
        ),
    ),
    ExtractionTask(
        "paper",
        "'Attention Is All You Need' by Ashish Vaswani, Noam Shazeer and Niki Parmar appeared at NeurIPS in "
        "2017. Keywords: transformers, attention, sequence modeling.",
        _object(
            {
                "title": _STR,
                "authors": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 6},
                "year": {"type": "integer"},
                "venue": _STR,
                "keywords": {"type": "array", "items": _STR, "maxItems": 8},
            },
            ["title", "authors", "year", "venue", "keywords"],
        ),
    ),
)
