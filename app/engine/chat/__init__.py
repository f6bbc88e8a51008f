"""Chat formats: templates, thinking markers and budget forcing, tool-call formats, their streaming parser
and the checks of a request's tools (docs/tools.md, docs/reasoning.md)."""
