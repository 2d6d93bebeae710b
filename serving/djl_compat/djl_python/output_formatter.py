"""LMI's output formatter decorator.

    from djl_python.output_formatter import output_formatter

    @output_formatter
    def custom_output(response): ...

The marked function gets vLLM's answer object, as LMI's vLLM handler passes it: a CompletionResponse
(LMI bodies and OpenAI completion bodies) or a ChatCompletionResponse, or, when streaming, each chunk
vLLM's handler yields (a server-sent event string, `data: {...}`). Its return value is the answer's
body: a str or bytes as is, anything else as JSON.
"""


def output_formatter(function):
    """Mark `function` as the model's output formatter (the attribute LMI's handler looks for)."""
    function.is_output_formatter = True
    return function


class TextGenerationOutput:
    """The name LMI's rolling-batch formatters are annotated with. LMI's vLLM handler, which this
    container follows, never passes one: it calls only functions marked @output_formatter, with
    vLLM's answer objects."""
