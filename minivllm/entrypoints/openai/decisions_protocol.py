"""Pydantic models of vLLM's ``POST /v1/decisions`` (OpenAI's Decisions API): a text and questions about it
(predicate, choice, score) in; each question's answer with its probabilities out. Field names, limits and the
refusal of images are vLLM's."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, model_validator

ShortText = Annotated[StrictStr, Field(max_length=1 << 20)]
InputText = Annotated[StrictStr, Field(max_length=10 << 20)]
ChoiceValue = StrictStr | StrictBool


class DecisionModel(BaseModel):
    """A Decisions body part: unknown fields are refused (as vLLM)."""

    model_config = ConfigDict(extra="forbid")


class DecisionInputText(DecisionModel):
    """A text part of an input message."""

    type: Literal["input_text"]
    text: InputText


class DecisionInputMessage(DecisionModel):
    """A user message of the input: a text, or text parts."""

    role: Literal["user"]
    content: InputText | Annotated[list[DecisionInputText], Field(max_length=16384)]
    type: Literal["message"] = "message"

    @model_validator(mode="before")
    @classmethod
    def _no_images(cls, data: Any) -> Any:
        parts = data.get("content") if isinstance(data, dict) else None
        if isinstance(parts, list) and any(isinstance(p, dict) and p.get("type") == "input_image" for p in parts):
            raise ValueError("Decisions supports text input only; images are not supported")
        return data


class QuestionBase(DecisionModel):
    """What every question has: its instructions, and a name its answer repeats."""

    instructions: ShortText
    name: ShortText | None = None

    @model_validator(mode="after")
    def _named(self) -> QuestionBase:
        if "name" in self.model_fields_set and self.name is None:
            raise ValueError("name must be a string when provided")
        return self


class PredicateQuestion(QuestionBase):
    """Is it true? Answered with the probability that it is."""

    type: Literal["predicate"]


class ChoiceOption(DecisionModel):
    """One choice: its value (a string or a boolean), and what it means."""

    value: ChoiceValue
    description: ShortText = ""


class ChoiceQuestion(QuestionBase):
    """Which of these? Answered with the likeliest choice and each one's probability."""

    type: Literal["choice"]
    choices: list[ChoiceOption] = Field(min_length=2, max_length=255)

    @model_validator(mode="after")
    def _distinct(self) -> ChoiceQuestion:
        values = [(type(c.value), c.value) for c in self.choices]
        if len(set(values)) != len(values):
            raise ValueError("choice values must be distinct")
        return self


class ScoreLevel(DecisionModel):
    """One level of a score's scale, the first being 0."""

    label: ShortText
    description: ShortText = ""


class ScoreQuestion(QuestionBase):
    """Where on this scale? Answered with the expected level (0 for the first) and each level's probability."""

    type: Literal["score"]
    levels: list[ScoreLevel] = Field(min_length=2, max_length=10)


DecisionQuestion = Annotated[PredicateQuestion | ChoiceQuestion | ScoreQuestion, Field(discriminator="type")]


class DecisionRequest(DecisionModel):
    """``POST /v1/decisions``."""

    model: ShortText
    input: InputText | Annotated[list[DecisionInputMessage], Field(max_length=131072)]
    questions: list[DecisionQuestion] = Field(min_length=1, max_length=200)
    safety_identifier: Annotated[StrictStr, Field(max_length=128)] | None = None
    joint: StrictBool = False  # vLLM's extension: one read of all questions (diffusion models only)
    cache_salt: str | None = Field(None, min_length=1, max_length=1024)

    def input_text(self) -> str:
        """The input as one text: the messages' texts, a blank line between two."""
        if isinstance(self.input, str):
            return self.input
        return "\n\n".join(m.content if isinstance(m.content, str) else "\n".join(p.text for p in m.content)
                           for m in self.input)
