//! The thirteen built-in cache presets: one rule each for a popular content-delivery service
//! (game stores, game consoles, operating-system updates, application stores, Linux package
//! repositories), enabled by name through `cache.presets` or the presets API.
//!
//! Domain patterns use the route matcher's syntax (exact name, `*.name`, `cdn*.name`); a unit
//! test parses every one with [`DomainPattern::parse`](crate::route_matcher::DomainPattern).
//! Only plain-HTTP downloads are cached, so a preset helps with the clients and CDNs that
//! fetch their (signed) content over `http://` — which the game, console and OS update clients
//! below do for their bulk downloads.
//!
//! Like lancache, every preset drops the query string from the cache key (`ignore_query`):
//! CDN URLs carry per-client tokens while the path names the content. Content under the game,
//! console and OS presets is addressed by version or hash, so the origin's `Cache-Control` is
//! ignored and the preset TTL applies. The `linux` preset is the exception: repository index
//! files (`InRelease`, `repomd.xml`, `*.db`) change in place, so it honours the origin's
//! freshness (`respect_cache_control`), which for static mirrors usually means the RFC 9111
//! heuristic from `Last-Modified` (see [`super::policy`]).
//!
//! # Sources
//!
//! The game-store, console and Windows Update lists are taken from the public
//! `uklans/cache-domains` data set, commit 098c1e9c54556c6da64695cf3cdfeee13f011193
//! (files `steam.txt`, `epicgames.txt`, `blizzard.txt`, `origin.txt`, `riot.txt`, `uplay.txt`,
//! `sony.txt`, `xboxlive.txt`, `nintendo.txt`, `windowsupdates.txt`); every entry there already
//! parses as one of our patterns, so they are copied unchanged. Its licence:
//!
//! > MIT License — Copyright (c) 2017 UK LAN Techs. Permission is hereby granted, free of
//! > charge, to any person obtaining a copy of this software and associated documentation
//! > files (the "Software"), to deal in the Software without restriction, including without
//! > limitation the rights to use, copy, modify, merge, publish, distribute, sublicense, and/or
//! > sell copies of the Software, and to permit persons to whom the Software is furnished to do
//! > so, subject to the following conditions: The above copyright notice and this permission
//! > notice shall be included in all copies or substantial portions of the Software. THE
//! > SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED.
//!
//! Entries marked "(ours)" below, and the whole `apple`, `appstores` and `linux` lists, are
//! compiled by this project from the services' public download host names.

use std::time::Duration;

const DAY: u64 = 86_400;
/// Versioned / hash-addressed game and console content: a year.
const GAME_TTL: Duration = Duration::from_secs(365 * DAY);
/// OS updates and app-store packages: 90 days.
const UPDATE_TTL: Duration = Duration::from_secs(90 * DAY);
/// Upper bound for Linux repositories (the origin's freshness usually decides first).
const REPO_TTL: Duration = Duration::from_secs(30 * DAY);

/// One built-in preset (the spec's CachePreset, plus the two rule options a preset fixes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preset {
    /// Identifier used in `cache.presets` and `/api/v1/cache/presets/{name}`.
    pub name: &'static str,
    /// One line for operators.
    pub description: &'static str,
    /// Domain patterns (route matcher syntax).
    pub domains: &'static [&'static str],
    /// Freshness lifetime of cached responses (the upper bound when
    /// [`Preset::respect_cache_control`] is set).
    pub ttl: Duration,
    /// Rule priority; every preset uses 0, so a custom rule of the same priority wins
    /// (custom rules are evaluated before presets, see [`super::rules::effective_rules`]).
    pub priority: i32,
    /// Drop the query string from the cache key (true for every preset).
    pub ignore_query: bool,
    /// Honour the origin's `Cache-Control` / `Expires` / `Last-Modified` (only `linux`).
    pub respect_cache_control: bool,
}

const fn preset(
    name: &'static str,
    description: &'static str,
    domains: &'static [&'static str],
    ttl: Duration,
) -> Preset {
    Preset {
        name,
        description,
        domains,
        ttl,
        priority: 0,
        ignore_query: true,
        respect_cache_control: false,
    }
}

static PRESETS: [Preset; 13] = [
    // ---- game stores ----
    preset(
        "steam",
        "Steam (Valve) game and update downloads",
        &[
            "lancache.steamcontent.com",
            // (ours) the content servers and CDN front ends Steam clients download from
            "*.steamcontent.com",
            "content*.steampowered.com",
            "*.cs.steampowered.com",
            "steampipe.akamaized.net",
            "steampipe-kr.akamaized.net",
            "steampipe-partner.akamaized.net",
            "edgecast.steamstatic.com",
            "cdn.akamai.steamstatic.com",
        ],
        GAME_TTL,
    ),
    preset(
        "epic",
        "Epic Games Store and Unreal Engine downloads",
        &[
            "cdn.unrealengine.com",
            "cdn1.epicgames.com",
            "cdn1.unrealengine.com",
            "cdn2.epicgames.com",
            "cdn2.unrealengine.com",
            "cdn3.unrealengine.com",
            "cloudflare.epicgamescdn.com",
            "download.epicgames.com",
            "download2.epicgames.com",
            "download3.epicgames.com",
            "download4.epicgames.com",
            "egdownload.fastly-edge.com",
            "epicgames-download1.akamaized.net",
            "fastly-download.epicgames.com",
        ],
        GAME_TTL,
    ),
    preset(
        "blizzard",
        "Blizzard Battle.net game and patch downloads",
        &[
            "*.cdn.blizzard.com",
            "blizzard.vo.llnwd.net",
            "blzddist1-a.akamaihd.net",
            "blzddist2-a.akamaihd.net",
            "blzddist3-a.akamaihd.net",
            "cdn.blizzard.com",
            "dist.blizzard.com",
            "dist.blizzard.com.edgesuite.net",
            "edge.blizzard.top.comcast.net",
            "level3.blizzard.com",
            "nydus.battle.net",
        ],
        GAME_TTL,
    ),
    preset(
        "origin",
        "EA app / Origin game downloads",
        &[
            "cdn-patch.swtor.com",
            "lvlt.cdn.ea.com",
            "origin-a.akamaihd.net",
        ],
        GAME_TTL,
    ),
    preset(
        "riot",
        "Riot Games (League of Legends, Valorant) patches",
        &[
            "*.dyn.riotcdn.net",
            "l3cdn.riotgames.com",
            "riotgamespatcher-a.akamaihd.net",
            "riotgamespatcher-a.akamaihd.net.edgesuite.net",
            "worldwide.l3cdn.riotgames.com",
        ],
        GAME_TTL,
    ),
    preset(
        "uplay",
        "Ubisoft Connect (Uplay) game downloads",
        &["*.cdn.ubi.com"],
        GAME_TTL,
    ),
    // ---- game consoles ----
    preset(
        "playstation",
        "PlayStation Network game, patch and system-software downloads",
        &[
            "*.gs2-ww-prod.psn.akadns.net",
            "*.gs2.sonycoment.loris-e.llnwd.net",
            "*.gs2.ww.prod.dl.playstation.net",
            "*.gs2.ww.prod.dl.playstation.net.edgesuite.net",
            "gs-sec.ww.np.dl.playstation.net",
            "gs2-ww-prod.psn.akadns.net",
            "gs2.ww.prod.dl.playstation.net",
            "gs2.ww.prod.dl.playstation.net.edgesuite.net",
            "gst.prod.dl.playstation.net",
            "playstation4.sony.akadns.net",
            "psnobj.prod.dl.playstation.net",
            "sgst.prod.dl.playstation.net",
            "theia.dl.playstation.net",
            "tmdb.np.dl.playstation.net",
            "uef.np.dl.playstation.net",
            "vulcan.dl.playstation.net",
        ],
        GAME_TTL,
    ),
    preset(
        "xbox",
        "Xbox Live game and update downloads",
        &[
            "assets1.xboxlive.com",
            "assets1.xboxlive.com.nsatc.net",
            "assets2.xboxlive.com",
            "d1.xboxlive.com",
            "xbox-mbr.xboxlive.com",
            "xvcf1.xboxlive.com",
            "xvcf2.xboxlive.com",
        ],
        GAME_TTL,
    ),
    preset(
        "nintendo",
        "Nintendo eShop and system updates (Switch, Wii U)",
        &[
            "*.hac.lp1.d4c.nintendo.net",
            "*.hac.lp1.eshop.nintendo.net",
            "*.wup.eshop.nintendo.net",
            "*.wup.shop.nintendo.net",
            "ccs.cdn.wup.shop.nintendo.net.edgesuite.net",
            "ecs-lp1.hac.shop.nintendo.net",
            "geisha-wup.cdn.nintendo.net",
            "geisha-wup.cdn.nintendo.net.edgekey.net",
            "idbe-wup.cdn.nintendo.net",
            "idbe-wup.cdn.nintendo.net.edgekey.net",
            "receive-lp1.dg.srv.nintendo.net",
        ],
        GAME_TTL,
    ),
    // ---- operating-system updates ----
    preset(
        "windows",
        "Windows Update, Microsoft Store and Office downloads (Delivery Optimization CDN)",
        &[
            "*.dl.delivery.mp.microsoft.com",
            "*.do.dsp.mp.microsoft.com",
            "*.microsoft.com.edgesuite.net",
            "*.update.microsoft.com",
            "*.windowsupdate.com",
            "amupdatedl.microsoft.com",
            "amupdatedl2.microsoft.com",
            "amupdatedl3.microsoft.com",
            "amupdatedl4.microsoft.com",
            "amupdatedl5.microsoft.com",
            "dl.delivery.mp.microsoft.com",
            "officecdn.microsoft.com",
            "officecdn.microsoft.com.edgesuite.net",
        ],
        UPDATE_TTL,
    ),
    preset(
        "apple",
        "macOS and iOS software updates and installers (not the changing update catalogs)",
        &[
            "swcdn.apple.com",
            "swdist.apple.com",
            "updates.cdn-apple.com",
            "updates-http.cdn-apple.com",
            "appldnld.apple.com",
            "oscdn.apple.com",
            "osrecovery.apple.com",
            "audiocontentdownload.apple.com",
        ],
        UPDATE_TTL,
    ),
    // ---- application stores ----
    preset(
        "appstores",
        "Application stores: Apple App Store, Google Play and Chrome component downloads \
         (the Microsoft Store shares the windows preset's CDN)",
        &[
            "iosapps.itunes.apple.com",
            "*.phobos.apple.com",
            "*.gvt1.com",
            "dl.google.com",
            "dl.l.google.com",
            "play.googleapis.com",
        ],
        UPDATE_TTL,
    ),
    // ---- Linux package repositories ----
    Preset {
        name: "linux",
        description: "Linux package repositories: Debian, Ubuntu, Raspberry Pi OS, Fedora, \
                      CentOS/Rocky/AlmaLinux, openSUSE, Arch Linux, Alpine, Linux Mint \
                      (honours origin freshness: index files change in place)",
        domains: &[
            // Debian
            "deb.debian.org",
            "ftp.debian.org",
            "security.debian.org",
            "ftp.*.debian.org",
            "cdn-fastly.deb.debian.org",
            // Ubuntu
            "archive.ubuntu.com",
            "*.archive.ubuntu.com",
            "security.ubuntu.com",
            "ports.ubuntu.com",
            // Raspberry Pi OS
            "archive.raspberrypi.org",
            "archive.raspberrypi.com",
            "raspbian.raspberrypi.org",
            // Fedora / Red Hat family
            "download.fedoraproject.org",
            "dl.fedoraproject.org",
            "mirror.centos.org",
            "vault.centos.org",
            "dl.rockylinux.org",
            "repo.almalinux.org",
            // openSUSE
            "download.opensuse.org",
            "cdn.opensuse.org",
            // Arch Linux
            "geo.mirror.pkgbuild.com",
            "mirror.pkgbuild.com",
            // Alpine
            "dl-cdn.alpinelinux.org",
            // Linux Mint
            "packages.linuxmint.com",
            // kernel.org mirrors many distributions
            "mirrors.kernel.org",
        ],
        ttl: REPO_TTL,
        priority: 0,
        ignore_query: true,
        respect_cache_control: true,
    },
];

/// Every built-in preset, in documentation order (game stores, consoles, OS updates,
/// application stores, Linux repositories).
pub fn all() -> &'static [Preset] {
    &PRESETS
}

/// The preset called `name` (exact, lower case).
pub fn find(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

/// The preset names, for messages ("one of steam, epic, …").
pub fn names() -> impl Iterator<Item = &'static str> {
    PRESETS.iter().map(|p| p.name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route_matcher::DomainPattern;
    use std::collections::HashSet;

    #[test]
    fn thirteen_unique_names() {
        assert_eq!(all().len(), 13);
        let names: HashSet<&str> = names().collect();
        assert_eq!(names.len(), 13);
        for p in all() {
            assert_eq!(find(p.name), Some(p));
            assert!(!p.name.is_empty() && !p.description.is_empty());
            assert!(
                p.name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
                "{}",
                p.name
            );
            assert!(!p.ttl.is_zero());
            assert!(!p.domains.is_empty(), "{}", p.name);
        }
        assert_eq!(find("Steam"), None);
        assert_eq!(find("nope"), None);
    }

    #[test]
    fn every_domain_parses_and_is_listed_once() {
        let mut seen: HashSet<String> = HashSet::new();
        for p in all() {
            for d in p.domains {
                let parsed = DomainPattern::parse(d).unwrap_or_else(|e| panic!("{}: {e}", p.name));
                // already normalised: what we wrote is what the matcher keeps
                assert_eq!(parsed.as_str(), *d, "{}", p.name);
                assert!(
                    seen.insert(parsed.as_str().to_owned()),
                    "{d} is listed twice"
                );
                assert_ne!(*d, "*", "{}: a preset must not match everything", p.name);
            }
        }
    }

    #[test]
    fn presets_match_their_cdns() {
        let m = |name: &str, host: &str| {
            find(name)
                .map(|p| {
                    p.domains
                        .iter()
                        .filter_map(|d| DomainPattern::parse(d).ok())
                        .any(|d| d.matches(host))
                })
                .unwrap_or(false)
        };
        assert!(m("steam", "cache12-fra2.steamcontent.com"));
        assert!(m("steam", "content7.steampowered.com"));
        assert!(!m("steam", "store.steampowered.com"));
        assert!(m("blizzard", "level3.blizzard.com"));
        assert!(m("blizzard", "us.cdn.blizzard.com"));
        assert!(m("windows", "7.tlu.dl.delivery.mp.microsoft.com"));
        assert!(m("windows", "download.windowsupdate.com"));
        assert!(m("linux", "deb.debian.org"));
        assert!(m("linux", "ftp.de.debian.org"));
        assert!(m("linux", "de.archive.ubuntu.com"));
        assert!(!m("linux", "debian.org"));
        assert!(m("appstores", "r3---sn-4g5e6nsz.gvt1.com"));
        assert!(m("nintendo", "atum.hac.lp1.d4c.nintendo.net"));
        assert!(m("playstation", "gs2.ww.prod.dl.playstation.net"));
        // Only the Linux preset follows origin freshness.
        for p in all() {
            assert_eq!(p.respect_cache_control, p.name == "linux", "{}", p.name);
            assert!(p.ignore_query);
        }
    }
}
