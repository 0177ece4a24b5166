package coord

import "github.com/kfpipe/kfpipe/internal/coord/coordconfig"

// Config is the coord section of the configuration (coordconfig.Config):
// etcd endpoints, timeouts, namespace, credentials and TLS.
type Config = coordconfig.Config

// TLSConfig names the PEM files of a TLS connection to etcd.
type TLSConfig = coordconfig.TLSConfig

// Defaults applied to zero fields of Config.
const (
	DefaultDialTimeout = coordconfig.DefaultDialTimeout
	DefaultKeepAlive   = coordconfig.DefaultKeepAlive
	DefaultNamespace   = coordconfig.DefaultNamespace
)

// DefaultConfig returns a Config for a local etcd with every default set.
func DefaultConfig() Config { return coordconfig.DefaultConfig() }
