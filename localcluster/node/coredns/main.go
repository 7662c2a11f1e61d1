// Command coredns is CoreDNS (coremain, as upstream's own main) with only the plugins the real node's cluster
// DNS uses (realnode.corefile): upstream's main imports core/plugin, which registers all ~60 plugins (cloud
// DNS providers, etcd, geoip, …); importing the few needed keeps the cold build small. No forward (nor
// loop, which guards forward): pods have no route off this machine, so only cluster names are answered.
// The plugin order stays upstream's (dnsserver.Directives), whichever plugins are compiled in.
package main

import (
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"

	"github.com/coredns/coredns/coremain"
)

func main() {
	coremain.Run()
}
