"""Schemas more than one of vLLM's adapted test modules send (vLLM repeats them per file)."""

EMPLOYEE = {  # vLLM's tests/entrypoints/conftest.py sample_json_schema
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "skills": {
            "type": "array",
            "items": {"type": "string", "maxLength": 10},
            "minItems": 3,
        },
        "work_history": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "company": {"type": "string"},
                    "duration": {"type": "number"},
                    "position": {"type": "string"},
                },
                "required": ["company", "position"],
            },
        },
    },
    "required": ["name", "age", "skills", "work_history"],
}
WEATHER_UNIT = {
    "type": "string",
    "description": "The unit to fetch the temperature in",
    "enum": ["celsius", "fahrenheit"],
}
WEATHER_OPTIONS = {
    "title": "WeatherOptions",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "unit": {
            "type": "string",
            "enum": ["celsius", "fahrenheit"],
            "default": "celsius",
            "description": "Temperature unit",
            "title": "Temperature Unit",
        },
        "include_forecast": {
            "type": "boolean",
            "default": False,
            "description": "Whether to include a 24-hour forecast",
            "title": "Include Forecast",
        },
        "language": {
            "type": "string",
            "default": "zh-CN",
            "description": "Language of the response",
            "title": "Language",
            "enum": ["zh-CN", "en-US", "ja-JP"],
        },
    },
}
INVALID_JSON_SCHEMA = {  # a property that is no schema: the grammar must not compile
    "$defs": {
        "CarType": {
            "enum": ["sedan", "SUV", "Truck", "Coupe"],
            "title": "CarType",
            "type": "string",
        }
    },
    "properties": {
        "brand": {"title": "Brand", "type": "string"},
        "model": {"title": "Model", "type": "string"},
        "car_type": {"$ref": "#/$defs/CarType"},
        "foo": "bar",  # not a schema
    },
    "required": ["brand", "model", "car_type"],
    "title": "CarDescription",
    "type": "object",
}
