"""LMI's input formatter decorator.

    from djl_python.input_parser import input_formatter

    @input_formatter
    def custom_input(decoded_payload: dict, tokenizer=None, **kwargs) -> dict: ...

The marked function gets the request's decoded JSON object (keyword arguments `tokenizer` and
`adapter_name`) and returns the object that is then served: a body with `inputs`, `prompt` or
`messages`.
"""


def input_formatter(function):
    """Mark `function` as the model's input formatter (the attribute LMI's handler looks for)."""
    function.is_input_formatter = True
    return function
