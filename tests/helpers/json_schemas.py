"""Twenty JSON schemas for the structured-output tests and benchmarks: nested objects, arrays, enums, required
fields, numbers with bounds, patterns, unions and references. Each has ``maxLength`` / ``maxItems`` where a
model that knows no JSON could otherwise write forever."""

SCHEMAS: dict[str, dict] = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 130}},
        "required": ["name", "age"], "additionalProperties": False},
    "point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
              "required": ["x", "y"], "additionalProperties": False},
    "color_enum": {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
                   "required": ["color"], "additionalProperties": False},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1, "maxItems": 4},
    "bounded_ints": {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5},
                     "minItems": 2, "maxItems": 5},
    "nested_address": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {
            "id": {"type": "integer", "minimum": 1, "maximum": 999},
            "address": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 10}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"], "additionalProperties": False}},
            "required": ["id", "address"], "additionalProperties": False}},
        "required": ["user"], "additionalProperties": False},
    "boolean_flags": {"type": "object", "properties": {"active": {"type": "boolean"}, "admin": {"type": "boolean"}},
                      "required": ["active", "admin"], "additionalProperties": False},
    "nullable": {"type": "object", "properties": {"note": {"type": ["string", "null"], "maxLength": 6}},
                 "required": ["note"], "additionalProperties": False},
    "const_version": {"type": "object", "properties": {"version": {"const": 2}, "ok": {"type": "boolean"}},
                      "required": ["version", "ok"], "additionalProperties": False},
    "array_of_objects": {"type": "array", "maxItems": 3, "minItems": 1, "items": {
        "type": "object", "properties": {"sku": {"type": "string", "maxLength": 6},
                                         "qty": {"type": "integer", "minimum": 1, "maximum": 99}},
        "required": ["sku", "qty"], "additionalProperties": False}},
    "price_bounds": {"type": "object", "properties": {
        "price": {"type": "number", "minimum": 0, "maximum": 1000}, "currency": {"enum": ["USD", "EUR"]}},
        "required": ["price", "currency"], "additionalProperties": False},
    "one_of_shapes": {"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "integer", "minimum": 1,
                                                                          "maximum": 9}},
         "required": ["kind", "r"], "additionalProperties": False},
        {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "integer", "minimum": 1,
                                                                             "maximum": 9}},
         "required": ["kind", "side"], "additionalProperties": False}]},
    "any_of_scalar": {"type": "object", "properties": {"value": {"anyOf": [
        {"type": "integer", "minimum": 0, "maximum": 50}, {"type": "string", "maxLength": 5}]}},
        "required": ["value"], "additionalProperties": False},
    "refs": {"$defs": {"pair": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                                "minItems": 2, "maxItems": 2}},
             "type": "object", "properties": {"a": {"$ref": "#/$defs/pair"}, "b": {"$ref": "#/$defs/pair"}},
             "required": ["a", "b"], "additionalProperties": False},
    "pattern_id": {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}},
                   "required": ["id"], "additionalProperties": False},
    "date_string": {"type": "object", "properties": {"day": {"type": "string", "format": "date"}},
                    "required": ["day"], "additionalProperties": False},
    "optional_fields": {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 10}, "pages": {"type": "integer", "minimum": 1, "maximum": 500},
        "isbn": {"type": "string", "maxLength": 13}}, "required": ["title"], "additionalProperties": False},
    "matrix": {"type": "array", "minItems": 2, "maxItems": 2, "items": {
        "type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "integer", "minimum": 0, "maximum": 9}}},
    "exclusive_bounds": {"type": "object", "properties": {
        # NOTE: multipleOf bounds the digits: the demo model greedily writes 0.000000006416486464... to max_tokens
        "ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1, "multipleOf": 0.05},
        "count": {"type": "integer", "exclusiveMinimum": 0, "maximum": 3}},
        "required": ["ratio", "count"], "additionalProperties": False},
    "tool_call_like": {"type": "object", "properties": {
        "name": {"enum": ["get_weather", "search"]},
        "arguments": {"type": "object", "properties": {"query": {"type": "string", "maxLength": 12},
                                                       "units": {"enum": ["metric", "imperial"]}},
                      "required": ["query", "units"], "additionalProperties": False}},
        "required": ["name", "arguments"], "additionalProperties": False},
}

assert len(SCHEMAS) == 20
