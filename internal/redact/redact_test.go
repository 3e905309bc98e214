package redact

import (
	"slices"
	"strings"
	"testing"
)

// TestURL checks that no piece of a password (3 bytes or more, raw or decoded) is left,
// however a malformed string splits: unencoded '/', '?', '#', '@' or ':' in a URL
// password, '&' or '#' in a query password, spaces and broken quotes in key=value.
func TestURL(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		url       string
		passwords []string // raw and decoded spellings
		want      string
	}{
		{"url", "postgres://bob:s3cret-Pw@127.0.0.1:5432/db?sslmode=disable", []string{"s3cret-Pw"}, "postgres://bob:xxxxx@127.0.0.1:5432/db?sslmode=disable"},
		{"url without password", "postgres://bob@127.0.0.1:5432/db?sslmode=disable", nil, "postgres://bob@127.0.0.1:5432/db?sslmode=disable"},
		{"slash in password", "postgres://u:s3cr/et@host/db", []string{"s3cr/et"}, "postgres://u:xxxxx@host/db"},
		{"slash in password after digits (a port to pgx and net/url)", "postgres://u:12/et9z@host/db", []string{"12/et9z"}, "postgres://u:xxxxx@host/db"},
		{"postgresql scheme", "postgresql://u:s3cr/et@host/db", []string{"s3cr/et"}, "postgresql://u:xxxxx@host/db"},
		{"at in password", "postgres://u:p@ss@host/db", []string{"p@ss"}, "postgres://u:xxxxx@host/db"},
		{"question mark and hash in password", "postgres://u:pa?ss#wo@host/db", []string{"pa?ss#wo"}, "postgres://u:xxxxx@host/db"},
		{"question mark and hash after digits", "postgres://u:12?ab#cd@host:5432/db?sslmode=disable", []string{"12?ab#cd"}, "postgres://u:xxxxx@host:5432/db?sslmode=disable"},
		{"colons in password", "postgres://u:se:cr:et@host/db", []string{"se:cr:et"}, "postgres://u:xxxxx@host/db"},
		{"percent-encoded password", "postgres://u:p%2Fw%40rd@host/db", []string{"p%2Fw%40rd", "p/w@rd"}, "postgres://u:xxxxx@host/db"},
		{"leading space", " postgres://u:s3cr/et@host/db", []string{"s3cr/et"}, " postgres://u:xxxxx@host/db"},
		{"password parameter", "postgres://bob@host/db?sslmode=disable&password=s3cr%26et", []string{"s3cr%26et", "s3cr&et"}, "postgres://bob@host/db?sslmode=disable&password=xxxxx"},
		{"password parameter with & and #", "postgres://bob@host/db?password=ab&cd#ef&sslmode=disable", []string{"ab&cd#ef"}, "postgres://bob@host/db?password=xxxxx"},
		{"password parameter with @", "postgres://host:5432/db?password=ab@cdef", []string{"ab@cdef"}, "postgres://host:xxxxx"},
		{"sslpassword parameter", "postgres://u@host/db?sslpassword=k3y-phr4se", []string{"k3y-phr4se"}, "postgres://u@host/db?sslpassword=xxxxx"},
		{"percent-encoded parameter name", "postgres://u@host/db?pass%77ord=s3cret", []string{"s3cret"}, "postgres://u@host/db?pass%77ord=xxxxx"},
		// Could be user "host" with password "5432/db?application_name=a": hidden.
		{"at in a query value", "postgres://host:5432/db?application_name=a@b", nil, "postgres://host:xxxxx@b"},
		{"key=value", "host=h user=u password=s3cr/et dbname=db", []string{"s3cr/et"}, "host=h user=u password=xxxxx dbname=db"},
		{"key=value without password", "host=h user=u dbname=db", nil, "host=h user=u dbname=db"},
		{"key=value, ? and #", "host=h password=s3?cr#et dbname=db", []string{"s3?cr#et"}, "host=h password=xxxxx dbname=db"},
		{"key=value, quoted with space and quote", `host=h password='s3 cr\'et' dbname=db`, []string{`s3 cr\'et`, "s3 cr'et"}, "host=h password=xxxxx dbname=db"},
		{"key=value, escaped space", `host=h password=s3cr\ et99 dbname=db`, []string{`s3cr\ et99`, "s3cr et99"}, "host=h password=xxxxx dbname=db"},
		{"key=value, spaces around =", "host=h password = s3cret dbname=db", []string{"s3cret"}, "host=h password = xxxxx dbname=db"},
		{"key=value, unquoted space", "host=h password=s3cr et99 dbname=db", []string{"s3cr et99"}, "host=h password=xxxxx dbname=db"},
		{"key=value, unquoted space at the end", "host=h password=s3cr et99", []string{"s3cr et99"}, "host=h password=xxxxx"},
		{"neither URL nor key=value (a password in the wrong place)", "s3cretPW", []string{"s3cretPW"}, "xxxxx"},
		{"token parameter", "http://127.0.0.1:9090/?token=s3cr3tpw", []string{"s3cr3tpw"}, "http://127.0.0.1:9090/?token=xxxxx"},
		{"api_key parameter", "http://prom:9090/?x=1&api_key=s3cr3tpw", []string{"s3cr3tpw"}, "http://prom:9090/?x=1&api_key=xxxxx"},
		{"http user alone (a token)", "http://s3cr3tpw@127.0.0.1:9090", []string{"s3cr3tpw"}, "http://xxxxx@127.0.0.1:9090"},
		{"database user alone is a role", "postgres://quotaplane_gateway@127.0.0.1/q", nil, "postgres://quotaplane_gateway@127.0.0.1/q"},
		{"key=value, unterminated quote", "host=h password='s3cr et99 dbname=db", []string{"s3cr et99 dbname=db"}, "host=h password=xxxxx"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := URL(tt.url)
			for _, p := range tt.passwords {
				for i := range len(p) {
					for j := i + 3; j <= len(p); j++ {
						if strings.Contains(got, p[i:j]) {
							t.Fatalf("URL(%q) = %q shows %q of the password", tt.url, got, p[i:j])
						}
					}
				}
			}
			if got != tt.want {
				t.Fatalf("URL(%q) = %q, want %q", tt.url, got, tt.want)
			}
		})
	}
}

// FuzzURL puts any password in a URL's userinfo and in a quoted key=value: nothing of
// it may be left.
func FuzzURL(f *testing.F) {
	for _, p := range []string{"s3cret", "s3cr/et", "p@ss", "a?b#c", "se:cr:et", "x?password=y", "it's", `back\slash`, "two words"} {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, pw string) {
		if got := URL("postgres://u:" + pw + "@host/db"); !strings.HasPrefix(got, "postgres://u:xxxxx") || !strings.HasSuffix("@host/db", strings.TrimPrefix(got, "postgres://u:xxxxx")) {
			t.Fatalf("password %q in a url: %q", pw, got)
		}
		quoted := "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(pw) + "'"
		if got := URL("host=h password=" + quoted + " dbname=db"); got != "host=h password=xxxxx dbname=db" {
			t.Fatalf("password %q in key=value: %q", pw, got)
		}
	})
}

// TestSecretsAndString: every spelling of a password that a message may quote (raw,
// percent-decoded, unquoted, unescaped) is found, and String takes each out.
func TestSecretsAndString(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		url  string
		want []string
	}{
		{"postgres://u:p%2Fw@host/db", []string{"p%2Fw", "p/w"}},
		{"host=h password='s3 cr\\'et' dbname=db", []string{"'s3 cr\\'et'", "s3 cr'et"}},
		{"redis://:s3cret@host:6379/0", []string{"s3cret"}},
		{"http://host:9090", nil},
		// pgx splits at the first '@' and quotes the rest as its host.
		{"postgres://u:p@s3cr3tpw@127.0.0.1:1/x", []string{"p@s3cr3tpw", "s3cr3tpw"}},
		{"http://127.0.0.1:1/?token=s3cr3tpw", []string{"s3cr3tpw"}},
	} {
		got := Secrets(tt.url)
		for _, w := range tt.want {
			if !slices.Contains(got, w) {
				t.Errorf("Secrets(%q) = %q, want %q among them", tt.url, got, w)
			}
		}
		if tt.want == nil && len(got) != 0 {
			t.Errorf("Secrets(%q) = %q, want none", tt.url, got)
		}
		msg := "cannot parse " + tt.url + ": " + strings.Join(tt.want, ", ")
		if out := String(msg, got); tt.want != nil && strings.Contains(out, tt.want[len(tt.want)-1]) {
			t.Errorf("String(%q) = %q shows the password", msg, out)
		}
	}
	if got := String("a  b", []string{"", "b"}); got != "a  xxxxx" {
		t.Errorf("String = %q, want only the secret replaced (an empty one ignored)", got)
	}
}
