package gendoc

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
)

// ErrMarkers is wrapped by every error about a document's markers: a section that is
// missing, unterminated, nested, repeated, or written in another marker style.
var ErrMarkers = errors.New("generated-section markers")

var (
	// marker is a well-formed marker line.
	marker = regexp.MustCompile(`^<!-- ([a-z][a-z0-9-]*):(begin|end)( \([^()]*\))? -->$`)
	// looksLikeMarker catches the other spellings (name:start, name:stop, a begin
	// marker sharing its line with text) so they fail instead of being ignored.
	looksLikeMarker = regexp.MustCompile(`<!-- *[A-Za-z0-9_-]+:(begin|end|start|stop)\b`)
	validName       = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
)

// span is one section: the byte offsets of its text (after the begin line, up to the
// end line).
type span struct {
	name       string
	begin, end int // text is doc[begin:end]
}

// parse finds every section of doc, checking the markers: one style, every begin
// closed by its own end before the next begin, no name twice.
func parse(doc []byte) ([]span, error) {
	var (
		spans []span
		open  *span
		off   int
		line  = 1
	)
	for len(doc[off:]) > 0 {
		rest := doc[off:]
		n := bytes.IndexByte(rest, '\n')
		next := off + n + 1
		if n < 0 {
			n, next = len(rest), len(doc)
		}
		text := strings.TrimSuffix(string(rest[:n]), "\r")
		if looksLikeMarker.MatchString(text) {
			m := marker.FindStringSubmatch(strings.TrimSpace(text))
			switch {
			case m == nil || strings.TrimSpace(text) != text:
				return nil, fmt.Errorf("%w: line %d: %q is not <!-- NAME:begin (note) --> or <!-- NAME:end --> alone on its line", ErrMarkers, line, text)
			case m[2] == "begin" && open != nil:
				return nil, fmt.Errorf("%w: line %d: %s begins inside %s", ErrMarkers, line, m[1], open.name)
			case m[2] == "begin":
				if slices.ContainsFunc(spans, func(s span) bool { return s.name == m[1] }) {
					return nil, fmt.Errorf("%w: line %d: section %s appears twice", ErrMarkers, line, m[1])
				}
				open = &span{name: m[1], begin: next}
			case m[3] != "":
				return nil, fmt.Errorf("%w: line %d: an end marker has no note: <!-- %s:end -->", ErrMarkers, line, m[1])
			case open == nil || open.name != m[1]:
				return nil, fmt.Errorf("%w: line %d: %s ends but was not begun", ErrMarkers, line, m[1])
			default:
				open.end = off
				spans = append(spans, *open)
				open = nil
			}
		}
		off = next
		line++
	}
	if open != nil {
		return nil, fmt.Errorf("%w: section %s begins but never ends", ErrMarkers, open.name)
	}
	return spans, nil
}

func find(doc []byte, name string) (span, error) {
	if !validName.MatchString(name) {
		return span{}, fmt.Errorf("%w: %q is not a section name ([a-z][a-z0-9-]*)", ErrMarkers, name)
	}
	spans, err := parse(doc)
	if err != nil {
		return span{}, err
	}
	for _, s := range spans {
		if s.name == name {
			return s, nil
		}
	}
	return span{}, fmt.Errorf("%w: no section %s (<!-- %s:begin --> ... <!-- %s:end -->)", ErrMarkers, name, name, name)
}

// Names lists the sections of doc in order, or says what is wrong with its markers.
func Names(doc []byte) ([]string, error) {
	spans, err := parse(doc)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(spans))
	for i, s := range spans {
		names[i] = s.name
	}
	return names, nil
}

// Section is the text of section name in doc: the lines between its markers.
func Section(doc []byte, name string) (string, error) {
	s, err := find(doc, name)
	if err != nil {
		return "", err
	}
	return string(doc[s.begin:s.end]), nil
}

// Replace returns doc with the text of section name replaced by text (the markers and
// everything outside them stay). The text is written as whole lines: a missing final
// newline is added.
func Replace(doc []byte, name, text string) ([]byte, error) {
	s, err := find(doc, name)
	if err != nil {
		return nil, err
	}
	if text != "" && !strings.HasSuffix(text, "\n") {
		text += "\n"
	}
	out := make([]byte, 0, len(doc)-(s.end-s.begin)+len(text))
	out = append(out, doc[:s.begin]...)
	out = append(out, text...)
	return append(out, doc[s.end:]...), nil
}

// Rewrite replaces the text of section name of the file at path (see Replace). The
// file is left as it was when its markers are wrong.
func Rewrite(path, name, text string) error {
	doc, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("rewrite section %s: %w", name, err)
	}
	out, err := Replace(doc, name, text)
	if err != nil {
		return fmt.Errorf("rewrite section %s of %s: %w", name, path, err)
	}
	if bytes.Equal(out, doc) {
		return nil
	}
	if err := os.WriteFile(path, out, 0o644); err != nil {
		return fmt.Errorf("rewrite section %s: %w", name, err)
	}
	return nil
}
