package gateway

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// apply adds the configured CA, client certificate and server name to the TLS
// configuration go-redis made from a rediss:// URL (which verifies against the system's
// roots and the URL's host). Verification is never turned off.
func (c RedisTLSConfig) apply(tc *tls.Config) error {
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return fmt.Errorf("ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("ca_file %s: no PEM certificate in it", c.CAFile)
		}
		tc.RootCAs = pool
	}
	if c.CertFile != "" || c.KeyFile != "" {
		if c.CertFile == "" || c.KeyFile == "" {
			return errors.New("give both cert_file and key_file, or neither")
		}
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return fmt.Errorf("cert_file/key_file: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	if c.ServerName != "" {
		tc.ServerName = c.ServerName
	}
	if tc.MinVersion < tls.VersionTLS12 {
		tc.MinVersion = tls.VersionTLS12
	}
	return nil
}
