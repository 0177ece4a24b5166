// Package coordconfig is the coord section of the configuration: the etcd
// connection settings and their validation. It imports nothing of kfpipe
// but the leaf package that reads its tags (internal/config/schema), so
// the config package can embed it without importing coord.
package coordconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/kfpipe/kfpipe/internal/config/schema"
)

// Defaults applied to zero fields of Config.
const (
	DefaultDialTimeout = 5 * time.Second
	DefaultKeepAlive   = 10 * time.Second
	DefaultNamespace   = "/kfpipe/"
)

// Config is the coord section of the configuration. Zero durations and an
// empty namespace take their defaults.
type Config struct {
	// Endpoints are the etcd client URLs ("http://host:2379") or host:port
	// pairs.
	Endpoints []string `mapstructure:"endpoints"`
	// DialTimeout bounds connecting to etcd.
	DialTimeout time.Duration `mapstructure:"dial_timeout" default:"DefaultDialTimeout" range:"[100ms, 1m]"`
	// KeepAlive is the lease TTL used when a caller passes ttl 0, and the
	// TTL of instance-ID leases: how long a dead process keeps its
	// registrations, locks and IDs. etcd counts lease TTLs in whole
	// seconds (and raises very short ones to its own minimum, about 2 s
	// with default election settings).
	KeepAlive time.Duration `mapstructure:"keep_alive" default:"DefaultKeepAlive" range:"[1s, 1h]"`
	// Namespace prefixes every key; it must end in "/".
	Namespace string `mapstructure:"namespace" default:"DefaultNamespace"`
	// Username and password enable etcd authentication when set (both or
	// neither).
	Username string `mapstructure:"username"`
	// Password is username's password; from the environment
	// (KFPIPE_COORD_PASSWORD), never a committed file.
	Password string `mapstructure:"password"`
	// TLS enables TLS when any of its files is set.
	TLS TLSConfig `mapstructure:"tls"`
}

// names are the defaults the tags name.
var names = schema.Names{
	"DefaultDialTimeout": DefaultDialTimeout,
	"DefaultKeepAlive":   DefaultKeepAlive,
	"DefaultNamespace":   DefaultNamespace,
}

// TLSConfig names the PEM files of a TLS connection to etcd.
type TLSConfig struct {
	// CertFile is the client certificate (with key_file, or neither).
	CertFile string `mapstructure:"cert_file"`
	// KeyFile is the client certificate's key.
	KeyFile string `mapstructure:"key_file"`
	// CAFile verifies the server; empty means the system roots.
	CAFile string `mapstructure:"ca_file"`
}

func (t TLSConfig) enabled() bool { return t.CertFile != "" || t.KeyFile != "" || t.CAFile != "" }

// DefaultConfig returns a Config for a local etcd with every default set.
func DefaultConfig() Config {
	return Config{Endpoints: []string{"http://127.0.0.1:2379"}}.WithDefaults()
}

// WithDefaults returns c with its zero fields set to the defaults.
func (c Config) WithDefaults() Config {
	names.SetDefaults(&c)
	return c
}

// Validate reports every invalid setting at once, each error naming its key
// (coord.endpoints, coord.dial_timeout, coord.tls.cert_file, …). It reads
// the TLS files' metadata, nothing else; it makes no connection.
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("coord.%s %s", key, fmt.Sprintf(format, args...)))
	}
	if err := names.Check("coord", c); err != nil {
		errs = append(errs, err)
	}
	if len(c.Endpoints) == 0 {
		bad("endpoints", "must not be empty")
	}
	for i, ep := range c.Endpoints {
		if err := checkEndpoint(ep); err != nil {
			bad(fmt.Sprintf("endpoints[%d]", i), "%q %v", ep, err)
		}
	}
	if !strings.HasSuffix(c.Namespace, "/") {
		bad("namespace", "must end in \"/\", got %q", c.Namespace)
	}
	if c.Password != "" && c.Username == "" {
		bad("username", "must be set when coord.password is")
	}
	if c.Username != "" && c.Password == "" {
		bad("password", "must be set when coord.username is")
	}
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		if c.TLS.CertFile == "" {
			bad("tls.cert_file", "must be set when coord.tls.key_file is")
		} else {
			bad("tls.key_file", "must be set when coord.tls.cert_file is")
		}
	}
	for _, f := range []struct{ key, path string }{
		{"tls.cert_file", c.TLS.CertFile}, {"tls.key_file", c.TLS.KeyFile}, {"tls.ca_file", c.TLS.CAFile},
	} {
		if f.path == "" {
			continue
		}
		if st, err := os.Stat(f.path); err != nil {
			bad(f.key, "%q is not readable: %v", f.path, err)
		} else if st.IsDir() {
			bad(f.key, "%q is a directory", f.path)
		}
	}
	return errors.Join(errs...)
}

func checkEndpoint(ep string) error {
	const want = "must be host:port or http(s)://host:port"
	if strings.TrimSpace(ep) != ep || ep == "" {
		return errors.New(want)
	}
	if strings.Contains(ep, "://") {
		u, err := url.Parse(ep)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return errors.New(want)
		}
		return nil
	}
	if _, _, err := net.SplitHostPort(ep); err != nil {
		return errors.New(want)
	}
	return nil
}

// TLSClientConfig loads the TLS files; nil when TLS is off.
func (c Config) TLSClientConfig() (*tls.Config, error) {
	if !c.TLS.enabled() {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.TLS.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.TLS.CertFile, c.TLS.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("coord.tls.cert_file/key_file: load key pair: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	if c.TLS.CAFile != "" {
		pem, err := os.ReadFile(c.TLS.CAFile)
		if err != nil {
			return nil, fmt.Errorf("coord.tls.ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("coord.tls.ca_file: no PEM certificate in %q", c.TLS.CAFile)
		}
		tc.RootCAs = pool
	}
	return tc, nil
}
