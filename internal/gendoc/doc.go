// Package gendoc owns the generated sections of committed documents: the one marker
// style, and the one reader and rewriter of what lies between the markers. A section
// is
//
//	<!-- NAME:begin (how it is made) -->
//	...generated text...
//	<!-- NAME:end -->
//
// with NAME in [a-z][a-z0-9-]*, each marker alone on its line, the note in parentheses
// optional (it says which command writes the section, or which test reads it). Every
// program that writes figures into docs/ (make bench, make bench-rls, the fault and
// torture suites' -update) and every test that reads a table from one (internal/arch)
// goes through this package, so a document has one syntax to keep.
//
// It imports nothing of this module.
package gendoc
