"""The lab: tiny models trained with each encoding and evaluated past their training length."""
