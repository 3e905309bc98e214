package redact

import (
	"cmp"
	"net/url"
	"slices"
	"strings"
)

// URL is url fit for messages: every stretch of it that may hold a password replaced
// by "xxxxx". Host, port, user and database stay where they can be told apart from the
// password; of a string that does not parse, or parses in more than one way, it hides more
// than the password, never less (see secretSpans).
func URL(url string) string {
	var b strings.Builder
	last := 0
	for _, sp := range secretSpans(url) {
		b.WriteString(url[last:sp.from])
		b.WriteString("xxxxx")
		last = sp.to
	}
	b.WriteString(url[last:])
	return b.String()
}

// span is the byte range [from, to) of a connection string.
type span struct{ from, to int }

// secretSpans is every stretch of s that may hold a password, sorted and merged. It reads s
// both as a URL and as a key=value string and, where a malformed string can be read in more
// than one way, takes the widest reading, so a password stays hidden however pgx, net/url
// or the person who wrote it split the string:
//
//   - URL userinfo: a password may hold an unencoded '/', '?', '#', '@' or ':', and each
//     parser then ends the userinfo elsewhere (pgx at the first '@' before a '/', net/url at
//     the last '@' before the first '/', '?' or '#'; postgres://u:s3cr/et@host has no
//     userinfo at all for either). So everything from the first ':' after "://" to the last
//     '@' counts, whenever there is such a ':'.
//   - URL query: the value of a password or sslpassword parameter (percent-encoded names
//     too) runs to the end of s, since an unencoded '&' or '#' may sit inside it.
//   - key=value: the value of every key ending in "password" (to the end of s if its quote
//     is unterminated), and the words after it that no '=' follows, which an unquoted
//     password with a space leaves behind (password=abc def host=h).
//   - neither: a string with no "://" and no '=' is no connection string at all, most
//     likely a password pasted in the wrong place (--database-url s3cretPW), so all of it.
func secretSpans(s string) []span {
	if t := strings.TrimSpace(s); t != "" && !strings.Contains(t, "://") && !strings.Contains(t, "=") {
		return []span{{0, len(s)}}
	}
	spans := append(urlSpans(s), kvSpans(s)...)
	slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.from, b.from) })
	var out []span
	for _, sp := range spans {
		if n := len(out); n > 0 && sp.from <= out[n-1].to {
			out[n-1].to = max(out[n-1].to, sp.to)
			continue
		}
		out = append(out, sp)
	}
	return out
}

func urlSpans(s string) []span {
	i := strings.Index(s, "://")
	if i < 0 {
		return nil
	}
	base := i + len("://")
	rest := s[base:]
	var out []span
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		if colon := strings.IndexByte(rest[:at], ':'); colon >= 0 {
			out = append(out, span{base + colon + 1, base + at})
		} else if scheme := strings.ToLower(strings.TrimSpace(s[:i])); (scheme == "http" || scheme == "https") &&
			!strings.ContainsAny(rest[:at], "/?#") {
			// http://TOKEN@host: a user alone is how tokens are passed to HTTP servers
			// (Prometheus behind a proxy); a database's or Redis's user is a role name.
			out = append(out, span{base, base + at})
		}
	}
	for j := 0; j < len(rest); j++ {
		if rest[j] != '?' && rest[j] != '&' {
			continue
		}
		name, _, ok := strings.Cut(rest[j+1:], "=")
		if !ok {
			break
		}
		if strings.ContainsAny(name, "?&") {
			continue // not a parameter name; the next '?' or '&' starts one
		}
		decoded, err := url.PathUnescape(name)
		if err != nil {
			decoded = name
		}
		if isPasswordKey(decoded) {
			out = append(out, span{base + j + 1 + len(name) + 1, len(s)})
			break
		}
	}
	return out
}

// kvSpans follows pgx's key=value grammar (values quoted with ' or bare, backslash escapes)
// but reads on past the errors that make pgx reject a string.
func kvSpans(s string) []span {
	var out []span
	afterPassword := false
	i := 0
	for {
		eq := strings.IndexByte(s[i:], '=')
		if eq < 0 {
			if end := len(strings.TrimRight(s, kvSpace)); afterPassword && end > i {
				out = append(out, span{i, end})
			}
			return out
		}
		name := strings.TrimRight(s[i:i+eq], kvSpace)
		k := strings.LastIndexAny(name, kvSpace)
		if afterPassword && k >= 0 {
			out = append(out, span{i, i + k}) // words between the password and the next key
		}
		name = name[k+1:]
		v := i + eq + 1
		for v < len(s) && strings.IndexByte(kvSpace, s[v]) >= 0 {
			v++
		}
		end := kvValueEnd(s, v)
		afterPassword = isPasswordKey(name)
		if afterPassword {
			out = append(out, span{v, end})
		}
		i = end
	}
}

const kvSpace = " \t\n\r\v\f"

// kvValueEnd is where the key=value value starting at s[v] ends: after its closing quote,
// at the next unescaped space, or at the end of s.
func kvValueEnd(s string, v int) int {
	if v < len(s) && s[v] == '\'' {
		for j := v + 1; j < len(s); j++ {
			switch s[j] {
			case '\\':
				j++
			case '\'':
				return j + 1
			}
		}
		return len(s) // unterminated: the rest may all be password
	}
	j := v
	for ; j < len(s) && strings.IndexByte(kvSpace, s[j]) < 0; j++ {
		if s[j] == '\\' {
			j++
		}
	}
	return min(j, len(s))
}

// isPasswordKey is whether a parameter of this name holds a secret: password,
// sslpassword, token, access_token, secret, api_key, apikey, signature, auth.
func isPasswordKey(name string) bool {
	name = strings.ToLower(strings.TrimSpace(name))
	for _, s := range [...]string{"password", "token", "secret", "key", "signature", "auth"} {
		if strings.HasSuffix(name, s) {
			return true
		}
	}
	return false
}

// Secrets is every password-like value in the URL or key=value string s that we can find
// without a full parse: the text of each secretSpans stretch, raw and decoded. String
// replaces them in a message.
func Secrets(s string) []string {
	var out []string
	add := func(v string) {
		if v != "" && !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	for _, sp := range secretSpans(s) {
		raw := s[sp.from:sp.to]
		add(raw)
		// u:p@ss@host: pgx ends the userinfo at the first '@' and reads "ss@host" as the
		// host, which its errors then quote ("lookup ss@host").
		for rest := raw; ; {
			_, after, ok := strings.Cut(rest, "@")
			if !ok {
				break
			}
			add(after)
			rest = after
		}
		if p, err := url.PathUnescape(raw); err == nil {
			add(p)
		}
		if p, err := url.QueryUnescape(raw); err == nil {
			add(p)
		}
		q := strings.Trim(raw, "'")
		add(q)
		add(kvUnescape(q))
	}
	if u, err := url.Parse(s); err == nil && strings.Contains(s, "://") {
		if p, ok := u.User.Password(); ok {
			add(p)
			add(url.QueryEscape(p))
			add(url.PathEscape(p))
		}
		for _, p := range u.Query()["password"] {
			add(p)
			add(url.QueryEscape(p))
		}
	}
	return out
}

// kvUnescape undoes the backslash escapes of a key=value value, as pgx does.
func kvUnescape(v string) string {
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		if v[i] == '\\' {
			if i++; i == len(v) {
				break
			}
		}
		b.WriteByte(v[i])
	}
	return b.String()
}

// String is msg with every secret (Secrets) replaced by "xxxxx".
func String(msg string, secrets []string) string {
	for _, p := range secrets {
		if p != "" {
			msg = strings.ReplaceAll(msg, p, "xxxxx")
		}
	}
	return msg
}
