package testenv

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TLSFiles are the PEM files of a throwaway certificate authority and of one certificate
// it issued for 127.0.0.1 and localhost, valid for both server and client authentication,
// so one set serves a TLS server and the clients that must present a certificate to it.
type TLSFiles struct {
	Dir      string
	CAFile   string // the CA's certificate: what clients trust
	CertFile string // the issued certificate
	KeyFile  string // its private key (mode 0600)
}

// NewTLSFiles makes a new CA and a certificate in dir. Every call makes a different CA,
// so a certificate of one set does not verify against another set's CA.
func NewTLSFiles(dir string) (TLSFiles, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return TLSFiles{}, fmt.Errorf("tls files: %w", err)
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return TLSFiles{}, fmt.Errorf("tls files: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "quotaplane test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return TLSFiles{}, fmt.Errorf("tls files: CA: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return TLSFiles{}, fmt.Errorf("tls files: CA: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return TLSFiles{}, fmt.Errorf("tls files: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return TLSFiles{}, fmt.Errorf("tls files: certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return TLSFiles{}, fmt.Errorf("tls files: key: %w", err)
	}
	f := TLSFiles{Dir: dir, CAFile: filepath.Join(dir, "ca.pem"), CertFile: filepath.Join(dir, "cert.pem"), KeyFile: filepath.Join(dir, "key.pem")}
	for _, w := range []struct {
		path, typ string
		der       []byte
		mode      os.FileMode
	}{
		{f.CAFile, "CERTIFICATE", caDER, 0o644},
		{f.CertFile, "CERTIFICATE", der, 0o644},
		{f.KeyFile, "PRIVATE KEY", keyDER, 0o600},
	} {
		if err := os.WriteFile(w.path, pem.EncodeToMemory(&pem.Block{Type: w.typ, Bytes: w.der}), w.mode); err != nil {
			return TLSFiles{}, fmt.Errorf("tls files: %w", err)
		}
	}
	return f, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}

// ClientConfig is a tls.Config that trusts the CA and presents the certificate.
func (f TLSFiles) ClientConfig() (*tls.Config, error) {
	caPEM, err := os.ReadFile(f.CAFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// StartRedisTLS starts redis-server on 127.0.0.1 accepting TLS only (no plain port), with
// the certificate of files, and requiring clients to present a certificate the same CA
// issued (tls-auth-clients yes). Its URL is RedisTLSURL.
func StartRedisTLS(ctx context.Context, opts RedisOptions, files TLSFiles) (*Process, error) {
	bin, err := lookBinary("redis-server", "redis-server")
	if err != nil {
		return nil, err
	}
	if opts.Dir == "" {
		if opts.Dir, err = os.MkdirTemp("", "quotaplane-redis-tls-*"); err != nil {
			return nil, fmt.Errorf("start redis (tls): %w", err)
		}
	}
	if opts.Port == 0 {
		if opts.Port, err = FreePort(); err != nil {
			return nil, err
		}
	}
	cfg, err := files.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("start redis (tls): %w", err)
	}
	p := &Process{Name: "redis", Host: "127.0.0.1", Port: opts.Port, Dir: opts.Dir, bin: bin}
	p.args = append([]string{
		"--port", "0", "--tls-port", strconv.Itoa(opts.Port), "--bind", "127.0.0.1",
		"--tls-cert-file", files.CertFile, "--tls-key-file", files.KeyFile,
		"--tls-ca-cert-file", files.CAFile, "--tls-auth-clients", "yes",
		"--save", "", "--appendonly", "no", "--dir", opts.Dir,
		"--daemonize", "no", "--protected-mode", "no",
	}, opts.Args...)
	p.ready = func(ctx context.Context) error { return redisTLSPing(ctx, p.Addr(), cfg) }
	if err := p.start(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// RedisTLSURL is the go-redis URL of a server started by StartRedisTLS.
func RedisTLSURL(p *Process) string { return "rediss://" + p.Addr() + "/0" }

func redisTLSPing(ctx context.Context, addr string, cfg *tls.Config) error {
	d := tls.Dialer{Config: cfg}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return pingConn(ctx, conn)
}

// StartPostgresTLS starts PostgreSQL with ssl=on and the certificate of files. Plain
// connections still work (the readiness check and URL use them); TLSURL gives a URL that
// requires TLS and verifies the server. PostgreSQL wants its key owned by its OS user at
// mode 0600, so the files are copied into certDir, a new temporary directory that the
// caller removes after Stop (PostgresTLSServer does).
func StartPostgresTLS(ctx context.Context, opts PostgresOptions, files TLSFiles) (p *Postgres, certDir string, err error) {
	dir, err := os.MkdirTemp("", "quotaplane-pg-tls-*")
	if err != nil {
		return nil, "", fmt.Errorf("start postgres (tls): %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	var uid, gid = -1, -1
	if os.Geteuid() == 0 {
		cred, err := postgresCredential()
		if err != nil {
			return nil, "", err
		}
		uid, gid = int(cred.Uid), int(cred.Gid)
	}
	copies := map[string]string{"ca.pem": files.CAFile, "server.crt": files.CertFile, "server.key": files.KeyFile}
	for name, src := range copies {
		b, err := os.ReadFile(src)
		if err != nil {
			return nil, "", fmt.Errorf("start postgres (tls): %w", err)
		}
		dst := filepath.Join(dir, name)
		if err := os.WriteFile(dst, b, 0o600); err != nil {
			return nil, "", fmt.Errorf("start postgres (tls): %w", err)
		}
		if uid >= 0 {
			if err := os.Chown(dst, uid, gid); err != nil {
				return nil, "", fmt.Errorf("start postgres (tls): %w", err)
			}
		}
	}
	if uid >= 0 {
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, "", fmt.Errorf("start postgres (tls): %w", err)
		}
	}
	opts.Args = append([]string{
		"-c", "ssl=on",
		"-c", "ssl_cert_file=" + filepath.Join(dir, "server.crt"),
		"-c", "ssl_key_file=" + filepath.Join(dir, "server.key"),
		"-c", "ssl_ca_file=" + filepath.Join(dir, "ca.pem"),
	}, opts.Args...)
	if p, err = StartPostgres(ctx, opts); err != nil {
		return nil, "", err
	}
	return p, dir, nil
}

// PostgresTLSServer is StartPostgresTLS for one test, stopped and removed at cleanup.
func PostgresTLSServer(t testing.TB, files TLSFiles) *Postgres {
	t.Helper()
	p, certDir, err := StartPostgresTLS(context.Background(), PostgresOptions{}, files)
	if err != nil {
		t.Fatalf("local.PostgresTLSServer: %v", err)
	}
	t.Cleanup(func() {
		_ = p.Stop()
		_ = p.Remove()
		_ = os.RemoveAll(certDir)
	})
	return p
}

// RedisTLS is StartRedisTLS for one test, killed at cleanup.
func RedisTLS(t testing.TB, files TLSFiles) *Process {
	t.Helper()
	p, err := StartRedisTLS(context.Background(), RedisOptions{Dir: t.TempDir()}, files)
	if err != nil {
		t.Fatalf("local.RedisTLS: %v", err)
	}
	t.Cleanup(func() { _ = p.Kill() })
	return p
}

// TLSURL is the URL of database db that requires TLS and verifies the server's
// certificate against caFile and its name (sslmode=verify-full).
func (p *Postgres) TLSURL(db, caFile string) string {
	q := url.Values{"sslmode": {"verify-full"}, "sslrootcert": {caFile}}
	u := url.URL{Scheme: "postgres", User: url.User("postgres"), Host: p.Addr(), Path: "/" + db, RawQuery: q.Encode()}
	return u.String()
}
