"""LMI's `djl_python` package as far as users' model.py files import it: the formatter decorators
(input_parser.input_formatter, output_formatter.output_formatter) and the names LMI's documented
formatter examples import beside them (encode_decode.decode, output_formatter.TextGenerationOutput).
Nothing else of LMI (djl-serving is not on the package index).

The launcher puts serving/djl_compat on the engine's Python path; serving/lmi/formatters.py finds
the functions these decorators mark and applies them as LMI's vLLM handler does.
"""
